import type { HttpResponse } from 'uWebSockets.js';
import type { ApiError } from '@svc/core';

const REASON: Record<number, string> = {
  400: 'Bad Request',
  404: 'Not Found',
  429: 'Too Many Requests',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
};

/**
 * Answers an ApiError from the edge in the same `{error, message}` shape the api role uses.
 * `close` ends the connection after the answer (for a request whose body is still arriving).
 * Call corked.
 */
export function writeError(res: HttpResponse, e: ApiError, close = false): void {
  res.writeStatus(`${e.status} ${REASON[e.status] ?? ''}`);
  res.writeHeader('content-type', 'application/json; charset=utf-8');
  if (e.retryAfter !== undefined) res.writeHeader('retry-after', String(e.retryAfter));
  if (close) res.writeHeader('connection', 'close');
  res.end(JSON.stringify(e.body()), close);
}
