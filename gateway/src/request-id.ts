import { randomUUID } from 'node:crypto';

/**
 * Every response carries the request's id in this header, and every log line of the request
 * carries it as `reqId`. The edge forwards it to the api role in the same header, after
 * replacing whatever the client sent that was not a usable id.
 */
export const REQUEST_ID_HEADER = 'x-request-id';

/** Up to 128 characters that need no escaping in a header or a log line. */
const USABLE = /^[A-Za-z0-9._:-]{1,128}$/;

/** The id of a request: the client's `X-Request-Id` when it is usable, else a new UUID. */
export function requestId(incoming: string | string[] | undefined): string {
  const value = Array.isArray(incoming) ? incoming[0] : incoming;
  return value && USABLE.test(value) ? value : randomUUID();
}
