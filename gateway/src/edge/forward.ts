import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import { EventEmitter } from 'node:events';
import { IncomingMessage, ServerResponse } from 'node:http';
import { type ApiError, tooLarge } from '@svc/core';
import type { Logger } from 'pino';
import { CLIENT_IP_HEADER } from '../internal-headers.ts';
import type { Admission } from '../ratelimit/admission.ts';
import { REQUEST_ID_HEADER } from '../request-id.ts';
import { writeError } from './respond.ts';

/**
 * Request headers the api role never sees: those that describe one hop (RFC 9110 7.6.1), our
 * own trusted ones (set below from what the edge settled), and `Expect`. The expectation is met
 * at the edge: uWebSockets.js answers `100 Continue` to `Expect: 100-continue` itself as soon as
 * it has parsed the head, and a request the edge refuses (a body announced over the limit, the
 * rate limit) gets its final status at once, with `Connection: close`, so the client stops
 * sending (RFC 9110 10.1.1). `Transfer-Encoding` stays: it tells the api a body follows.
 */
const NOT_PASSED = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'te',
  'trailer',
  'upgrade',
  'expect',
  CLIENT_IP_HEADER,
  REQUEST_ID_HEADER,
]);

/** Response headers uWebSockets.js writes itself (framing, the connection, the date). */
const NOT_RETURNED = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date']);

/** The largest answer held back while a client is still uploading (error bodies are small). */
const EARLY_ANSWER_MAX = 1024 * 1024;

/** A `node:http` request listener: what the api role (Fastify's `routing`) serves requests with. */
export type RequestListener = (req: IncomingMessage, res: ServerResponse) => void;

export interface Forwarder {
  /**
   * Hands one request to the api role in this process, streaming both bodies with
   * backpressure: the client's upload is paused while the api is not reading, and the api's
   * response is paused while the client is not reading. Must be called synchronously inside the
   * uWS handler (it reads the request, which uWS frees on return). `admit` decides, possibly
   * asynchronously, whether the request may go on; a refusal is answered as the ApiError it
   * resolves to. The api role answers with `requestId` and logs the request; what the edge
   * answers itself (a refusal) it logs here.
   */
  forward(res: HttpResponse, req: HttpRequest, clientIp: string, admit: () => Admission, requestId: string): void;
  /** Requests under way (for draining on shutdown). */
  readonly inFlight: number;
}

/**
 * The edge's hand-off to the api role without a socket between them: each request becomes a
 * genuine `node:http` IncomingMessage and ServerResponse, over a stand-in socket backed by the
 * uWS response, passed to `api` (Fastify's `routing`). Fastify and everything under it (plugins,
 * streamed replies, raw responses) see what `node:http` would give them; what Node would send on
 * the socket goes to uWebSockets.js instead. (It replaced an undici keep-alive pool over a Unix
 * socket, whose hop was most of the edge's cost on a small request.) `bodyLimit` is the api
 * role's largest body: a request announcing more is answered 413 here, before the api sees it.
 */
export function createForwarder(api: RequestListener, log: Logger, bodyLimit = Number.POSITIVE_INFINITY): Forwarder {
  let inFlight = 0;

  function forward(res: HttpResponse, req: HttpRequest, clientIp: string, admit: () => Admission, requestId: string) {
    const method = req.getCaseSensitiveMethod().toUpperCase();
    const query = req.getQuery();
    const url = req.getUrl();
    const rawHeaders: string[] = [];
    let hasBody = false;
    let announced: number | undefined;
    let conflicting = false;
    req.forEach((name, value) => {
      if (NOT_PASSED.has(name)) return;
      if (name === 'transfer-encoding') hasBody = true;
      else if (name === 'content-length') {
        if (announced !== undefined && Number(value) !== announced) conflicting = true;
        announced = Number(value);
        if (value !== '0') hasBody = true;
      }
      rawHeaders.push(name, value);
    });
    if (conflicting) {
      // Two lengths (RFC 9112 6.3): uWS framed the body by the first, so what follows may be a
      // request smuggled inside it, already parsed. Only closing the connection now stops it
      // (an answer, even with Connection: close, lets uWS dispatch it next); no answer is sent.
      log.info({ method, url, ip: clientIp }, 'refused: two different Content-Length headers; connection closed');
      res.close();
      return;
    }
    rawHeaders.push(CLIENT_IP_HEADER, clientIp, REQUEST_ID_HEADER, requestId);

    // The query stays out of the log: it may carry a token.
    const exchange = new Exchange(res, method, clientIp, log, requestId, url, () => {
      inFlight--;
    });
    inFlight++;
    res.onAborted(() => exchange.clientGone());
    const incoming = exchange.request(query ? `${url}?${query}` : url, rawHeaders, hasBody);

    const proceed = (refusal: ApiError | undefined) => {
      const reason =
        refusal ??
        (announced !== undefined && announced > bodyLimit
          ? tooLarge('The request body', bodyLimit, announced)
          : undefined);
      if (reason) exchange.answer(reason);
      else if (!exchange.aborted) api(incoming, exchange.response());
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
  };
}

type WriteCallback = (err?: Error | null) => void;

/**
 * What `node:http` writes a response to, standing in for its socket: `write` receives the
 * serialized head and then the body bytes, unframed (the response never chunks: see
 * `response()`). Reading is driven by the exchange, which pushes the client's body into the
 * request; `pause`/`resume` are how Node asks for less or more of it.
 */
class EdgeSocket extends EventEmitter {
  readable = true;
  writable = true;
  destroyed = false;
  /** The response this socket carries (`node:http` checks it before writing). */
  _httpMessage: ServerResponse | null = null;
  /**
   * Always corked as far as Node can tell, so it skips its per-write cork/uncork round through
   * the next tick: uWS writes are corked by the exchange itself.
   */
  readonly writableCorked = 1;
  readonly _writableState = { corked: 0 };
  readonly writableLength = 0;
  readonly readableHighWaterMark = 64 * 1024;
  readonly remotePort = 0;
  readonly encrypted = false;

  constructor(
    private readonly exchange: Exchange,
    readonly remoteAddress: string,
  ) {
    super();
  }

  get remoteFamily(): string {
    return this.remoteAddress.includes(':') ? 'IPv6' : 'IPv4';
  }

  write(data: string | Uint8Array, encoding?: BufferEncoding | WriteCallback | null, cb?: WriteCallback): boolean {
    if (typeof encoding === 'function') return this.exchange.write(data, undefined, encoding);
    return this.exchange.write(data, encoding ?? undefined, cb);
  }

  cork(): void {}
  uncork(): void {}
  pause(): this {
    this.exchange.pauseUpload();
    return this;
  }
  resume(): this {
    this.exchange.resumeUpload();
    return this;
  }
  setTimeout(): this {
    return this;
  }
  setNoDelay(): this {
    return this;
  }
  setKeepAlive(): this {
    return this;
  }
  address(): Record<string, never> {
    return {};
  }
  ref(): this {
    return this;
  }
  unref(): this {
    return this;
  }
  end(): this {
    this.destroy();
    return this;
  }
  destroySoon(): void {
    this.destroy();
  }
  /** Node gives up on the connection (an aborted request, a destroyed response): cut it. */
  destroy(_err?: Error): this {
    this.exchange.cut();
    return this;
  }

  /** The connection is gone: what `node:http` hears as the socket's close. */
  closed(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    this.readable = false;
    this.writable = false;
    process.nextTick(() => this.emit('close', false));
  }
}

/** The response's "needs drain" flag, which `node:http` clears when its socket drains. */
let needDrainSymbol: symbol | undefined | null = null;
function clearNeedDrain(res: ServerResponse): void {
  if (needDrainSymbol === null) {
    needDrainSymbol = Object.getOwnPropertySymbols(res).find((s) => s.description === 'kNeedDrain');
  }
  if (needDrainSymbol) (res as unknown as Record<symbol, boolean>)[needDrainSymbol] = false;
}

/**
 * One request's trip: the uWS response on one side, a `node:http` request and response on the
 * other. Responses with a Content-Length are written with `tryEnd` (uWS sends that length);
 * others chunked with `write`. When uWS reports backpressure, Node's write returns false until
 * the socket drains (then the response emits `drain`, as over a real socket).
 */
class Exchange {
  aborted = false;
  private done = false;
  private readonly socket: EdgeSocket;
  private incoming: IncomingMessage | undefined;
  private outgoing: ServerResponse | undefined;
  /** Set once Node has ended the response (`prefinish`). */
  private ended = false;

  // The response head, parsed from what Node serialized.
  private headParsed = false;
  private status = '';
  private headers: [string, string][] = [];
  private length: number | undefined;
  private noBody = false;
  private headWritten = false;

  /**
   * With a Content-Length: body bytes Node wrote that uWS has not taken yet, in order; uWS took
   * the first chunk up to its write offset less `queuedFrom`.
   */
  private queued: Buffer[] = [];
  private queuedFrom = 0;
  /**
   * Without one: body bytes written in this tick, sent together at its end, or with the answer's
   * end (uWS then gives it a Content-Length, as node:http does for a body passed to `end`).
   */
  private held: Buffer[] | undefined;
  /** Write callbacks waiting for the socket to drain. */
  private waiting: WriteCallback[] = [];
  private draining = false;

  /** True while the client's body is still arriving. */
  private uploading = false;
  private uploadPaused = false;
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
    clientIp: string,
    private readonly log: Logger,
    private readonly requestId: string,
    private readonly path: string,
    private readonly onFinish: () => void,
  ) {
    this.socket = new EdgeSocket(this, clientIp);
  }

  /** The request as `node:http` would have parsed it; its body (if any) streams from the client. */
  request(url: string, rawHeaders: string[], hasBody: boolean): IncomingMessage {
    const incoming = new IncomingMessage(this.socket as never);
    this.incoming = incoming;
    incoming.method = this.method;
    incoming.url = url;
    incoming.httpVersionMajor = 1;
    incoming.httpVersionMinor = 1;
    incoming.httpVersion = '1.1';
    incoming.rawHeaders = rawHeaders;
    const headers: Record<string, string | string[]> = {};
    const add = (incoming as unknown as { _addHeaderLine(f: string, v: string, d: object): void })._addHeaderLine;
    for (let i = 0; i < rawHeaders.length; i += 2)
      add.call(incoming, rawHeaders[i] as string, rawHeaders[i + 1] as string, headers);
    (incoming as { headers: object }).headers = headers;
    if (!hasBody) {
      this.bodyDone();
      return incoming;
    }
    this.uploading = true;
    this.res.onData((chunk, isLast) => {
      if (isLast) this.uploading = false;
      if (this.done) return;
      // uWS frees the ArrayBuffer after this callback returns, so copy it out.
      if (chunk.byteLength > 0 && !incoming.push(Buffer.copyBytesFrom(new Uint8Array(chunk))) && !isLast) {
        this.pauseUpload();
      }
      if (isLast) this.bodyDone();
    });
    return incoming;
  }

  private bodyDone(): void {
    const incoming = this.incoming as IncomingMessage;
    incoming.complete = true;
    incoming.push(null);
    this.socket.readable = false;
  }

  pauseUpload(): void {
    if (!this.uploading || this.uploadPaused || this.done) return;
    this.uploadPaused = true;
    this.res.pause();
  }

  resumeUpload(): void {
    if (!this.uploadPaused || this.done) return;
    this.uploadPaused = false;
    this.res.resume();
  }

  /** The response the api writes, on the stand-in socket. */
  response(): ServerResponse {
    const incoming = this.incoming as IncomingMessage;
    const outgoing = new ServerResponse(incoming);
    this.outgoing = outgoing;
    // Never chunk-encode: the body reaches uWS unframed, and uWS frames it. (Without a length,
    // Node then marks the response as the connection's last, which nothing here acts on.)
    outgoing.useChunkedEncodingByDefault = false;
    outgoing.assignSocket(this.socket as never);
    outgoing.once('prefinish', () => {
      this.ended = true;
      this.complete();
    });
    // What node:http's server does once a response has gone: the request's unread body is
    // dropped, the socket detached, and the response closes.
    outgoing.once('finish', () => {
      const state = (incoming as unknown as { _readableState: { resumeScheduled: boolean } })._readableState;
      if (!(incoming as unknown as { _consuming: boolean })._consuming && !state.resumeScheduled) {
        (incoming as unknown as { _dump(): void })._dump();
      }
      if (this.socket._httpMessage === outgoing) outgoing.detachSocket(this.socket as never);
      process.nextTick(() => {
        const o = outgoing as unknown as { _closed: boolean; destroyed: boolean };
        if (!o._closed) {
          o.destroyed = true;
          o._closed = true;
          outgoing.emit('close');
        }
      });
    });
    return outgoing;
  }

  /** The request line of an answer the edge gave itself (the api role logs the others). */
  private logAnswer(status: number): void {
    const ms = Math.round((performance.now() - this.startedAt) * 10) / 10;
    this.log.info({ reqId: this.requestId, method: this.method, path: this.path, status, ms }, 'request');
  }

  /** The uWS response is over (answered, cut, or the client gone); the HttpResponse is dead from here on. */
  private finish(sent: boolean): void {
    if (this.done) return;
    this.done = true;
    this.uploading = false;
    this.onFinish();
    this.queued = [];
    this.held = undefined;
    const waiting = this.waiting;
    this.waiting = [];
    // Sent: the writes that waited are done (the last one is Node's cue to emit `finish`).
    // Otherwise Node hears the socket close instead.
    if (sent) for (const cb of waiting) process.nextTick(cb);
  }

  clientGone(): void {
    this.aborted = true;
    this.finish(false);
    this.hangUp();
  }

  /** Node destroyed the socket: the connection is cut, the client sees a truncated answer. */
  cut(): void {
    if (!this.done) {
      this.res.cork(() => this.res.close());
      this.finish(false);
    }
    this.hangUp();
  }

  /**
   * The socket closes under Node: the response closes, and a request whose response had not
   * finished is aborted, as node:http's server does when a connection drops.
   */
  private hangUp(): void {
    if (this.socket.destroyed) return;
    this.socket.closed();
    const incoming = this.incoming;
    if (incoming && !incoming.destroyed && !this.outgoing?.writableFinished) {
      incoming.destroy(Object.assign(new Error('aborted'), { code: 'ECONNRESET' }));
    }
  }

  /** An answer from the edge itself (a refusal), in the api's `{error, message}` shape. */
  answer(e: ApiError): void {
    if (this.done) return;
    this.res.cork(() => writeError(this.res, e, this.uploading, this.requestId));
    this.logAnswer(e.status);
    this.finish(true);
  }

  /** Node writes the serialized head first (alone, or followed by the first body bytes), then the body. */
  write(data: string | Uint8Array, encoding: BufferEncoding | undefined, cb: WriteCallback | undefined): boolean {
    if (!this.headParsed) {
      const head = (this.outgoing as unknown as { _header: string | null })._header ?? '';
      this.parseHead(head);
      if (typeof data === 'string') data = data.slice(head.length);
    }
    const chunk = typeof data === 'string' ? Buffer.from(data, encoding ?? 'utf8') : data;
    const ok = this.done || this.noBody ? true : this.send(chunk);
    if (cb) {
      if (ok) process.nextTick(cb);
      else this.waiting.push(cb);
    }
    return ok;
  }

  /**
   * Node serializes the head as `HTTP/1.1 <status>\r\n`, then `<name>: <value>\r\n` per header
   * (values cannot hold CR or LF), then an empty line.
   */
  private parseHead(head: string): void {
    this.headParsed = true;
    let end = head.indexOf('\r\n');
    if (end < 0) end = head.length;
    this.status = head.slice(9, end);
    const code = Number(this.status.slice(0, 3));
    for (let at = end + 2; at < head.length; at = end + 2) {
      end = head.indexOf('\r\n', at);
      if (end < 0) end = head.length;
      const colon = head.indexOf(':', at);
      if (colon < 0 || colon > end) continue;
      const name = head.slice(at, colon);
      const value = head.slice(head.charCodeAt(colon + 1) === 32 ? colon + 2 : colon + 1, end);
      const lower = name.toLowerCase();
      if (lower === 'content-length') this.length = Number(value);
      if (NOT_RETURNED.has(lower)) continue;
      this.headers.push([name, value]);
    }
    this.noBody = this.method === 'HEAD' || code === 204 || code === 304;
    if (this.uploading && !this.noBody) this.early = { chunks: [], size: 0 };
  }

  /**
   * Status and headers wait for the first body bytes (or the end), so a small answer leaves in
   * one write: every cork outside a uWS callback is a send() of its own.
   */
  private writeHead(): void {
    if (this.headWritten) return;
    this.headWritten = true;
    const res = this.res;
    res.writeStatus(this.status);
    for (const [name, value] of this.headers) res.writeHeader(name, value);
    if (this.early) res.writeHeader('connection', 'close');
  }

  /** Body bytes to uWS; false when the client is not keeping up. */
  private send(chunk: Uint8Array): boolean {
    // The head alone (flushHeaders) waits for the first body bytes or the end: uWS sends a
    // head only with them.
    if (chunk.byteLength === 0) return this.queued.length === 0;
    const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    if (this.early) {
      this.early.chunks.push(buf);
      this.early.size += buf.length;
      if (this.early.size > EARLY_ANSWER_MAX) this.cut();
      return true;
    }
    if (this.length === undefined) {
      // The first bytes wait for the end of the tick, in case the answer ends with them; more
      // in the same tick make it a stream.
      if (!this.headWritten && !this.held) {
        this.holdUntilTickEnd();
        (this.held as unknown as Buffer[]).push(buf);
        return true;
      }
      return this.stream(buf);
    }
    if (this.queued.length > 0) {
      this.queued.push(buf);
      return false;
    }
    const res = this.res;
    let ok = true;
    res.cork(() => {
      this.writeHead();
      const from = res.getWriteOffset();
      const [taken, responded] = res.tryEnd(buf, this.length as number);
      if (responded) this.finish(true);
      else if (!taken) {
        this.queued.push(buf);
        this.queuedFrom = from;
        this.awaitDrain();
        ok = false;
      }
    });
    return ok;
  }

  private holdUntilTickEnd(): void {
    this.held = [];
    process.nextTick(() => {
      if (this.held && !this.done && !this.ended) this.stream();
    });
  }

  /** Bytes of a body of unknown length (chunked by uWS), after any held back; false under backpressure. */
  private stream(buf?: Buffer): boolean {
    const held = this.held ?? [];
    this.held = undefined;
    if (buf) held.push(buf);
    const res = this.res;
    let ok = true;
    res.cork(() => {
      this.writeHead();
      for (const b of held) ok = res.write(b);
    });
    if (!ok) this.awaitDrain();
    return ok;
  }

  /** Resumes writing when uWS can take more, then lets Node write again (`drain`). */
  private awaitDrain(): void {
    if (this.draining) return;
    this.draining = true;
    this.res.onWritable(() => {
      if (this.done) return true;
      const res = this.res;
      while (this.queued.length > 0) {
        const buf = this.queued[0] as Buffer;
        const [taken, responded] = res.tryEnd(
          buf.subarray(res.getWriteOffset() - this.queuedFrom),
          this.length as number,
        );
        if (responded) {
          this.finish(true);
          return true;
        }
        if (!taken) return false;
        this.queued.shift();
        this.queuedFrom = res.getWriteOffset();
      }
      this.draining = false;
      const waiting = this.waiting;
      this.waiting = [];
      for (const cb of waiting) cb();
      const outgoing = this.outgoing;
      if (outgoing?.writableNeedDrain) {
        clearNeedDrain(outgoing);
        outgoing.emit('drain');
      }
      // Ended while waiting: what is left to do is known now.
      if (this.ended) this.complete();
      return true;
    });
  }

  /** Node has ended the response: send what uWS still needs to end it too. */
  private complete(): void {
    if (this.done || this.queued.length > 0) return;
    const res = this.res;
    if (this.early) {
      const body = Buffer.concat(this.early.chunks);
      res.cork(() => {
        this.writeHead();
        res.end(body, true);
      });
    } else if (this.noBody) {
      // A HEAD answer names the length a GET would have, written here: this uWS build's
      // endWithoutBody(n) leaves the connection waiting for n bytes (its next request is never
      // answered), and endWithoutBody(undefined) writes a Content-Length of 2^63. A 204 or
      // 304 carries none (RFC 9110 8.6).
      res.cork(() => {
        this.writeHead();
        if (this.method === 'HEAD' && this.length !== undefined) res.writeHeader('content-length', String(this.length));
        res.endWithoutBody();
      });
    } else if (this.length === undefined || this.length === 0) {
      const held = this.held;
      this.held = undefined;
      res.cork(() => {
        this.writeHead();
        if (held?.length) res.end(held.length === 1 ? held[0] : Buffer.concat(held));
        else res.end();
      });
    } else {
      // Less than announced, which must not pass for a complete answer.
      res.cork(() => res.close());
      this.finish(false);
      this.hangUp();
      return;
    }
    this.finish(true);
  }
}
