/**
 * Headers the edge and the api role agree on. The edge sets the client's address (and drops
 * any copy a client sent); the api role trusts it only behind the edge, where it does not
 * listen at all: the edge hands it each request in-process.
 */
export const CLIENT_IP_HEADER = 'x-svc-client-ip';
