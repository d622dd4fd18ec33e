import type { ApiError } from '@svc/core';
import type { Admission } from '../ratelimit/admission.ts';

/**
 * What the streams need of an HTTP response, whichever server carries it: the edge's uWS
 * response, or node's when the api role serves alone. One SSE implementation sits behind it.
 * No method may be called after `end`, `close` or the `onAborted` handler ran.
 */
export interface StreamResponse {
  /** Runs `fn` with its writes sent together, in one packet where they fit. */
  cork(fn: () => void): void;
  /** Status 200 and the stream's headers; once, before any write. */
  writeHead(headers: Record<string, string>): void;
  /**
   * Writes bytes; false when the transport is holding some back (the client reads slower than
   * it is written to). They are still sent, in order; `onDrain` says when.
   */
  write(chunk: string | Buffer): boolean;
  /** Calls `handler` once everything written so far has gone to the socket, after a write returned false. */
  onDrain(handler: () => void): void;
  /** Ends the response; the client may reconnect. */
  end(): void;
  /** Drops the connection without ending the response (a watcher cut off). */
  close(): void;
  /**
   * Calls `target.aborted()` once if the client goes away before the response ends. An object
   * rather than a function: a node holds one per open stream, and the watcher is that object.
   */
  onAborted(target: { aborted(): void }): void;
  /** Answers `{error, message}` instead of a stream; only before `writeHead`. */
  error(e: ApiError): void;
}

/**
 * What a stream request carries, read by the transport before anything is awaited (uWS frees
 * its request object when the handler returns).
 */
export interface Opening {
  ip: string;
  authorization: string;
  cookie: string;
  origin: string;
  /** The Last-Event-ID header, or '' when absent. */
  lastEventId: string;
  query: URLSearchParams;
  /** The rate limit's decision for this request (streams count once, at open). */
  admit: () => Admission;
}
