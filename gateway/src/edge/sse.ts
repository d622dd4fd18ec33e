import type { HttpRequest, HttpResponse, TemplatedApp } from 'uWebSockets.js';
import type { ApiError } from '@svc/core';
import type { AdmitFor } from '../ratelimit/admission.ts';
import type { Opening, StreamResponse } from '../streams/response.ts';
import { STREAM_PATHS, type StreamServer } from '../streams/streams.ts';
import { canonicalIp } from './client-ip.ts';
import { writeError } from './respond.ts';

/** The edge's transport of the streams: uWS routes, each request read into an Opening. */
export function registerSse(app: TemplatedApp, streams: StreamServer, admitFor: AdmitFor): void {
  const opening = (res: HttpResponse, req: HttpRequest): Opening => {
    const ip = canonicalIp(Buffer.from(res.getRemoteAddressAsText()).toString());
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
    streams.conversation(new UwsStreamResponse(res), opening(res, req), id);
  });
  app.get(STREAM_PATHS.events, (res, req) => streams.events(new UwsStreamResponse(res), opening(res, req)));
  app.get(STREAM_PATHS.team, (res, req) => streams.team(new UwsStreamResponse(res), opening(res, req)));
}

/** A uWS response as a StreamResponse. */
class UwsStreamResponse implements StreamResponse {
  /** Ended, cut or aborted: uWS forbids touching the response from then on. */
  private gone = false;
  constructor(private readonly res: HttpResponse) {}

  cork(fn: () => void): void {
    this.res.cork(fn);
  }

  writeHead(headers: Record<string, string>): void {
    this.res.writeStatus('200 OK');
    for (const [k, v] of Object.entries(headers)) this.res.writeHeader(k, v);
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
  }

  close(): void {
    this.gone = true;
    this.res.close();
  }

  onAborted(handler: () => void): void {
    this.res.onAborted(() => {
      this.gone = true;
      handler();
    });
  }

  error(e: ApiError): void {
    writeError(this.res, e);
  }
}
