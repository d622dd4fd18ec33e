/**
 * runner-agent: installed on tenant machines, it connects out to the service over `ws`,
 * builds sandboxes in a directory it owns and streams runtime output back.
 *
 * Not built yet: the runner fabric is issue 6. This package exists so the workspace has its
 * final shape; it exports only the protocol version it will speak.
 */
export const RUNNER_PROTOCOL_VERSION = 1;
