import type { HttpResponse } from 'uWebSockets.js';
import { STATUS_CODES } from 'node:http';
import type { ApiError } from '@svc/core';
import { REQUEST_ID_HEADER } from '../request-id.ts';

/**
 * Answers an ApiError from the edge in the same `{error, message}` shape the api role uses.
 * `close` ends the connection after the answer (for a request whose body is still arriving);
 * uWS then sends `Connection: close` itself. `requestId` is echoed in X-Request-Id.
 * Call corked.
 */
export function writeError(res: HttpResponse, e: ApiError, close = false, requestId?: string): void {
  res.writeStatus(`${e.status} ${STATUS_CODES[e.status] ?? ''}`);
  res.writeHeader('content-type', 'application/json; charset=utf-8');
  if (requestId) res.writeHeader(REQUEST_ID_HEADER, requestId);
  if (e.retryAfter !== undefined) res.writeHeader('retry-after', String(e.retryAfter));
  res.end(JSON.stringify(e.body()), close);
}
