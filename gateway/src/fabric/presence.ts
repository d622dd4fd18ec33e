// What the fabric and those it serves (services, sandbox providers) agree on about runners: how
// their tokens look, when one counts as online, and what a turn says when one stayed away.

/** Runner tokens are told apart from API keys by their prefix. */
export const RUNNER_TOKEN_PREFIX = 'svcr_';

/**
 * Why a turn on a self-hosted runner failed when the runner stayed away past the grace period.
 * The node that held the runner's connection says it when the grace runs out; any node's sweep
 * of turns adrift says the same when that node is gone too (a restart) or its timer came late.
 */
export const RUNNER_STAYED_AWAY =
  'The runner went offline and did not come back in time: check that svc-runner is running and can reach the service, then send the prompt again.';

/** Presence: a runner is online while connected and heard from within `offlineAfterMs`. */
export function runnerOnline(connected: boolean, lastSeenAt: Date | null, offlineAfterMs: number, now = Date.now()) {
  return connected && lastSeenAt !== null && now - lastSeenAt.getTime() < offlineAfterMs;
}
