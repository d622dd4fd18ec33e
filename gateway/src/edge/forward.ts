import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import { STATUS_CODES } from 'node:http';
import { Readable } from 'node:stream';
import { ApiError } from '@svc/core';
import type { Logger } from 'pino';
import { type Dispatcher, Pool } from 'undici';
import { CLIENT_IP_HEADER } from '../internal-headers.ts';
import type { Admission } from '../ratelimit/admission.ts';
import { REQUEST_ID_HEADER } from '../request-id.ts';
import { writeError } from './respond.ts';

/**
 * Headers never forwarded: those that describe one hop (RFC 9110 7.6.1), our own trusted one,
 * and `Expect`. The expectation is met at the edge: uWebSockets.js answers `100 Continue` to
 * `Expect: 100-continue` itself as soon as it has parsed the head, and a request the edge
 * refuses (a body announced over the limit, the rate limit) gets its final status at once,
 * with `Connection: close`, so the client stops sending (RFC 9110 10.1.1). Passed on, the
 * header would make undici refuse the whole request.
 */
const NOT_FORWARDED = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'expect',
  CLIENT_IP_HEADER,
]);

/** The largest answer held back while a client is still uploading (error bodies are small). */
const EARLY_ANSWER_MAX = 1024 * 1024;

export interface Forwarder {
  /**
   * Forwards one request to the api role, streaming both bodies with backpressure: the
   * client's upload is paused while the api is not reading, and the api's response is paused
   * while the client is not reading. Must be called synchronously inside the uWS handler (it
   * reads the request, which uWS frees on return). `admit` decides, possibly asynchronously,
   * whether the request may go on; a refusal is answered as the ApiError it resolves to. The
   * api role answers with `requestId` and logs the request; what the edge answers itself
   * (a refusal, the api unreachable) it logs here.
   */
  forward(res: HttpResponse, req: HttpRequest, clientIp: string, admit: () => Admission, requestId: string): void;
  /** Requests under way (for draining on shutdown). */
  readonly inFlight: number;
  close(): Promise<void>;
}

/**
 * `bodyLimit` is the api role's largest body: a request announcing more is answered 413 here,
 * before a byte is forwarded. (Were it forwarded, the api would answer early and drop the
 * connection while the body still flows, and that answer can be lost to the broken pipe.)
 */
export function createForwarder(
  upstream: { socketPath: string } | { origin: string },
  log: Logger,
  bodyLimit = Number.POSITIVE_INFINITY,
): Forwarder {
  const options = { connections: 512, pipelining: 1, keepAliveTimeout: 30_000 };
  const pool =
    'socketPath' in upstream
      ? new Pool('http://api.internal', { ...options, connect: { socketPath: upstream.socketPath } })
      : new Pool(upstream.origin, options);
  let inFlight = 0;

  function forward(res: HttpResponse, req: HttpRequest, clientIp: string, admit: () => Admission, requestId: string) {
    const method = req.getCaseSensitiveMethod().toUpperCase();
    const query = req.getQuery();
    const url = req.getUrl();
    const path = query ? `${url}?${query}` : url;
    const headers: string[] = [];
    let hasBody = false;
    let announced = 0;
    req.forEach((name, value) => {
      // The request id is replaced by the one the edge settled on (the client's when usable).
      if (NOT_FORWARDED.has(name) || name === REQUEST_ID_HEADER) {
        if (name === 'transfer-encoding') hasBody = true;
        return;
      }
      if (name === 'content-length') {
        announced = Number(value);
        if (value !== '0') hasBody = true;
      }
      headers.push(name, value);
    });
    headers.push(CLIENT_IP_HEADER, clientIp, REQUEST_ID_HEADER, requestId);

    // The query stays out of the log: it may carry a token.
    const exchange = new Exchange(res, method, log.child({ reqId: requestId }), requestId, url, () => {
      inFlight--;
    });
    inFlight++;
    res.onAborted(() => exchange.clientGone());
    const body = hasBody ? exchange.uploadStream() : null;

    const dispatch = () => {
      if (exchange.aborted) return;
      pool.dispatch(
        { path, method: method as Dispatcher.HttpMethod, headers, body, headersTimeout: 0, bodyTimeout: 0 },
        exchange,
      );
    };
    const refuse = (e: ApiError) => {
      body?.destroy();
      exchange.answer(e);
    };
    const tooLarge = announced > bodyLimit ? new ApiError('payload_too_large') : undefined;
    const proceed = (refusal: ApiError | undefined) => {
      const reason = refusal ?? tooLarge;
      if (reason) refuse(reason);
      else dispatch();
    };
    // admit() never throws and its promise never rejects: the edge admits on limiter failure.
    const decision = admit();
    if (decision instanceof Promise) void decision.then(proceed);
    else proceed(decision);
  }

  return {
    forward,
    get inFlight() {
      return inFlight;
    },
    close: () => pool.close(),
  };
}

/**
 * One request's trip: the uWS response on one side, an undici dispatch handler on the other.
 * Responses with a Content-Length are written with `tryEnd` (uWS sends that length); others
 * chunked with `write`. When uWS reports backpressure the undici side is paused until the
 * socket drains.
 */
class Exchange implements Dispatcher.DispatchHandler {
  aborted = false;
  private done = false;
  private started = false;
  private length: number | undefined;
  private controller: Dispatcher.DispatchController | undefined;
  private paused = false;
  private status = 0;
  private headers: Record<string, string | string[] | undefined> = {};
  private headWritten = false;
  /** True while the client's body is still arriving. */
  private uploading = false;
  /**
   * An answer that starts before the client finished its upload (an early 413, say) is
   * buffered and sent with `Connection: close`: the rest of the upload would otherwise be read
   * as the next request on a reused connection.
   */
  private early: { chunks: Buffer[]; size: number } | undefined;

  private readonly startedAt = performance.now();

  constructor(
    private readonly res: HttpResponse,
    private readonly method: string,
    private readonly log: Logger,
    private readonly requestId: string,
    private readonly path: string,
    private readonly onFinish: () => void,
  ) {}

  /** The request line of an answer the edge gave itself (the api role logs the others). */
  private logAnswer(status: number): void {
    const ms = Math.round((performance.now() - this.startedAt) * 10) / 10;
    this.log.info({ method: this.method, path: this.path, status, ms }, 'request');
  }

  private finish(): void {
    if (!this.done) {
      this.done = true;
      // The answer is out (or the client gone): the HttpResponse is dead from here on, so
      // whatever of the upload is still arriving is dropped, and undici stops sending it.
      this.upload?.destroy();
      this.onFinish();
    }
  }

  clientGone(): void {
    this.aborted = true;
    this.controller?.abort(new Error('client went away'));
    this.finish();
  }

  private upload: Readable | undefined;

  /** The client's request body as a stream that pauses the client while nobody reads it. */
  uploadStream(): Readable {
    let paused = false;
    const res = this.res;
    const upload = new Readable({
      read: () => {
        if (paused && !this.aborted && !this.done) {
          paused = false;
          res.resume();
        }
      },
    });
    this.upload = upload;
    this.uploading = true;
    res.onData((chunk, isLast) => {
      if (isLast) this.uploading = false;
      if (this.done || upload.destroyed) return;
      // uWS frees the ArrayBuffer after this callback returns, so copy it out.
      if (chunk.byteLength > 0 && !upload.push(Buffer.from(chunk.slice(0))) && !isLast) {
        paused = true;
        res.pause();
      }
      if (isLast) upload.push(null);
    });
    return upload;
  }

  answer(e: ApiError): void {
    if (this.aborted || this.done) return;
    this.res.cork(() => writeError(this.res, e, this.uploading, this.requestId));
    this.logAnswer(e.status);
    this.finish();
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.aborted) controller.abort(new Error('client went away'));
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: Record<string, string | string[] | undefined>,
  ): void {
    if (this.aborted || statusCode < 200) return;
    this.started = true;
    this.status = statusCode;
    this.headers = headers;
    if (this.uploading) this.early = { chunks: [], size: 0 };
    const lengthHeader = headers['content-length'];
    this.length = typeof lengthHeader === 'string' ? Number(lengthHeader) : undefined;
    if (this.method === 'HEAD' || statusCode === 204 || statusCode === 304) {
      this.res.cork(() => {
        this.writeHead();
        this.res.endWithoutBody(this.method === 'HEAD' ? this.length : undefined);
      });
      this.finish();
    }
  }

  /**
   * Status and headers wait for the first body bytes (or the end), so a small answer leaves in
   * one write: every cork outside a uWS callback is a send() of its own.
   */
  private writeHead(): void {
    if (this.headWritten) return;
    this.headWritten = true;
    const res = this.res;
    res.writeStatus(`${this.status} ${STATUS_CODES[this.status] ?? ''}`);
    const headers = this.headers;
    for (const name in headers) {
      const value = headers[name];
      if (value === undefined || name === 'content-length' || name === 'date' || NOT_FORWARDED.has(name)) continue;
      if (typeof value === 'string') res.writeHeader(name, value);
      else for (const v of value) res.writeHeader(name, v);
    }
    if (this.early) res.writeHeader('connection', 'close');
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.aborted || this.done) return;
    if (this.early) {
      this.early.chunks.push(chunk);
      this.early.size += chunk.length;
      if (this.early.size > EARLY_ANSWER_MAX) {
        this.res.cork(() => this.res.close());
        this.finish();
      }
      return;
    }
    const res = this.res;
    res.cork(() => {
      this.writeHead();
      if (this.length !== undefined) {
        const startOffset = res.getWriteOffset();
        const [ok, responded] = res.tryEnd(chunk, this.length);
        if (responded) return this.finish();
        if (!ok) {
          this.pause(controller);
          res.onWritable((offset) => {
            const [ok2, responded2] = res.tryEnd(chunk.subarray(offset - startOffset), this.length as number);
            if (responded2) this.finish();
            else if (ok2) this.resume(controller);
            return ok2;
          });
        }
      } else if (!res.write(chunk)) {
        this.pause(controller);
        res.onWritable(() => {
          this.resume(controller);
          return true;
        });
      }
    });
  }

  private pause(controller: Dispatcher.DispatchController): void {
    this.paused = true;
    controller.pause();
  }

  private resume(controller: Dispatcher.DispatchController): void {
    if (this.paused) {
      this.paused = false;
      controller.resume();
    }
  }

  onResponseEnd(): void {
    if (this.aborted || this.done) return;
    if (this.early) {
      const body = Buffer.concat(this.early.chunks);
      this.res.cork(() => {
        this.writeHead();
        this.res.end(body, true);
      });
      this.finish();
      return;
    }
    // With a known length, a chunk still waiting for the socket holds the rest of the body:
    // its onWritable handler completes the answer.
    if (this.length !== undefined && this.paused) return;
    // A zero-length body; or less than announced, which must not pass for a complete answer.
    this.res.cork(() => {
      if (this.length === undefined || this.length === 0) {
        this.writeHead();
        this.res.end();
      } else {
        this.res.close();
      }
    });
    this.finish();
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    if (this.aborted || this.done) return;
    if (!this.started) {
      const code = (err as { code?: string }).code;
      this.log.error({ err: { message: err.message, code } }, 'api role unreachable');
      const e = new ApiError('api_unavailable');
      this.res.cork(() => writeError(this.res, e, false, this.requestId));
      this.logAnswer(e.status);
    } else {
      // Mid-body: cut the connection so the client sees a truncated answer, not a short one.
      this.res.cork(() => this.res.close());
    }
    this.finish();
  }
}
