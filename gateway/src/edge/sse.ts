import type { HttpRequest, HttpResponse, TemplatedApp } from 'uWebSockets.js';
import type { ApiError } from '@svc/core';
import type { Logger } from 'pino';
import type { AdmitFor } from '../ratelimit/admission.ts';
import { REQUEST_ID_HEADER, requestId } from '../request-id.ts';
import type { Opening, StreamResponse } from '../streams/response.ts';
import { STREAM_PATHS, type StreamServer } from '../streams/streams.ts';
import type { ClientOf } from './client-ip.ts';
import { writeError } from './respond.ts';

/**
 * The edge's transport of the streams: uWS routes, each request read into an Opening. Each
 * stream is logged once, when it ends, with its route and how long it ran.
 */
export function registerSse(
  app: TemplatedApp,
  streams: StreamServer,
  admitFor: AdmitFor,
  log: Logger,
  clientOf: ClientOf,
): void {
  const response = (res: HttpResponse, req: HttpRequest, route: string) =>
    new UwsStreamResponse(res, requestId(req.getHeader(REQUEST_ID_HEADER)), route, log);
  const opening = (res: HttpResponse, req: HttpRequest): Opening => {
    const ip = clientOf(res, req);
    return {
      ip,
      authorization: req.getHeader('authorization'),
      cookie: req.getHeader('cookie'),
      origin: req.getHeader('origin'),
      lastEventId: req.getHeader('last-event-id'),
      query: new URLSearchParams(req.getQuery() ?? ''),
      admit: admitFor(ip, req.getUrl()),
    };
  };
  app.get(STREAM_PATHS.conversation, (res, req) => {
    const id = req.getParameter(0) ?? '';
    streams.conversation(response(res, req, STREAM_PATHS.conversation), opening(res, req), id);
  });
  app.get(STREAM_PATHS.events, (res, req) =>
    streams.events(response(res, req, STREAM_PATHS.events), opening(res, req)),
  );
  app.get(STREAM_PATHS.team, (res, req) => streams.team(response(res, req, STREAM_PATHS.team), opening(res, req)));
}

/** A uWS response as a StreamResponse. */
class UwsStreamResponse implements StreamResponse {
  /** Ended, cut or aborted: uWS forbids touching the response from then on. */
  private gone = false;
  private status = 0;
  private loggedOnce = false;
  private readonly startedAt = performance.now();
  constructor(
    private readonly res: HttpResponse,
    private readonly requestId: string,
    private readonly route: string,
    private readonly log: Logger,
  ) {}

  /** The request line, once the stream is over: ended, cut off by the server, or left by the client. */
  private logged(how: 'ended' | 'cut' | 'aborted'): void {
    if (this.loggedOnce) return;
    this.loggedOnce = true;
    const ms = Math.round(performance.now() - this.startedAt);
    const { requestId: reqId, route, status } = this;
    const end = how === 'ended' ? {} : how === 'cut' ? { cut: true } : { aborted: true };
    this.log.info({ reqId, method: 'GET', route, status, ms, ...end }, 'request');
  }

  cork(fn: () => void): void {
    this.res.cork(fn);
  }

  writeHead(headers: Record<string, string>): void {
    this.status = 200;
    this.res.writeStatus('200 OK');
    for (const [k, v] of Object.entries(headers)) this.res.writeHeader(k, v);
    this.res.writeHeader(REQUEST_ID_HEADER, this.requestId);
  }

  write(chunk: string | Buffer): boolean {
    return this.res.write(chunk);
  }

  /**
   * uWS sends what it holds back for a socket only when something is written to it, and stops
   * watching the socket once an onWritable handler returns without a failed write: a handler
   * that wrote nothing left the tail of the last frames in uWS's buffer until the next write,
   * an event or a heartbeat up to heartbeatMs later (a resumed watcher sat silent although its
   * events were on the server). So the handler writes an empty comment line, which pushes the
   * held bytes out first; when they do not all go, uWS keeps watching and calls again. Every
   * write ends a frame, so the comment never lands inside one.
   */
  onDrain(handler: () => void): void {
    const { res } = this;
    res.onWritable(() => {
      if (this.gone) return true;
      let ok = true;
      res.cork(() => {
        ok = res.write(':\n\n');
      });
      if (ok) handler();
      return ok;
    });
  }

  end(): void {
    this.gone = true;
    this.res.end();
    this.logged('ended');
  }

  close(): void {
    this.gone = true;
    this.res.close();
    this.logged('cut');
  }

  onAborted(target: { aborted(): void }): void {
    this.res.onAborted(() => {
      this.gone = true;
      this.logged('aborted');
      target.aborted();
    });
  }

  error(e: ApiError): void {
    this.status = e.status;
    writeError(this.res, e, false, this.requestId);
    this.logged('ended');
  }
}
