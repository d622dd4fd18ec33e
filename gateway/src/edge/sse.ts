import type { HttpRequest, HttpResponse, TemplatedApp } from 'uWebSockets.js';
import { ApiError, LOG_STREAMS } from '@svc/core';
import { conversations, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import { follow } from '../log/follow.ts';
import type { EventLog, LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { shapeEvent } from '../services/conversations.ts';
import { authenticateBearer, authenticateSession } from '../services/credentials.ts';
import type { Principal } from '../services/principal.ts';
import { canonicalIp } from './client-ip.ts';
import type { Admission } from './forward.ts';
import { writeError } from './respond.ts';

export interface SseOptions {
  heartbeatMs: number;
  /** Close after this long without an event (heartbeats do not count); 0 never. */
  idleCloseMs: number;
  /** A watcher whose unsent bytes exceed this is cut off; it resumes with Last-Event-ID. */
  maxBufferedBytes: number;
}

export interface SseDeps {
  sql: Sql;
  log: EventLog;
  logger: Logger;
  options: SseOptions;
  /** API_CORS_ORIGINS: origins whose browsers may read streams (with a bearer key). */
  corsOrigins: readonly string[];
}

const TURN_ENDS = new Set(['done', 'failed', 'interrupted', 'timeout']);

/** One open stream. All watchers share one timer (no per-watcher timers). */
interface Watcher {
  res: HttpResponse;
  lastEventAt: number;
  lastBeatAt: number;
  /** Bytes handed to uWS while it reported backpressure. */
  backlog: number;
  closed: boolean;
  stop?: () => void;
}

function cookieValue(header: string, name: string): string | undefined {
  for (const part of header.split(';')) {
    const [k, ...v] = part.trim().split('=');
    if (k === name) return v.join('=');
  }
  return undefined;
}

/**
 * Server-Sent Events served by the edge itself. `GET /api/conversations/:id/stream` replays
 * the conversation's events after `Last-Event-ID` (header, or `last_event_id` in the query for
 * clients that cannot set headers) and then follows live, without a gap (follow()). Another
 * tenant's conversation is answered 404 before any byte of stream. `wait=false` (default) ends
 * the response once the conversation has no running turn; `wait=true` stays open across turns
 * until the conversation terminates or the idle close.
 */
export function registerSse(app: TemplatedApp, deps: SseDeps, admitFor: (ip: string, path: string) => () => Admission) {
  const { options } = deps;
  const watchers = new Set<Watcher>();

  const timer = setInterval(
    () => {
      const now = Date.now();
      for (const w of watchers) {
        if (w.closed) continue;
        if (options.idleCloseMs > 0 && now - w.lastEventAt >= options.idleCloseMs) {
          end(w);
        } else if (now - w.lastBeatAt >= options.heartbeatMs) {
          w.lastBeatAt = now;
          send(w, ': heartbeat\n\n');
        }
      }
    },
    Math.max(
      10,
      Math.min(1000, Math.floor(Math.min(options.heartbeatMs, options.idleCloseMs || options.heartbeatMs) / 4)),
    ),
  );
  timer.unref();

  /** Ends a watcher: gracefully (`end`, the client may reconnect) or by cutting the socket. */
  function finish(w: Watcher, how: 'end' | 'cut'): void {
    if (w.closed) return;
    w.closed = true;
    w.stop?.();
    watchers.delete(w);
    if (how === 'end') w.res.cork(() => w.res.end());
    else w.res.close();
  }
  const end = (w: Watcher) => finish(w, 'end');
  const cut = (w: Watcher) => finish(w, 'cut');

  /** Writes a frame corked; a watcher that falls too far behind is cut off, never waited for. */
  function send(w: Watcher, frame: string): void {
    if (w.closed) return;
    let ok = true;
    w.res.cork(() => {
      ok = w.res.write(frame);
    });
    if (!ok) {
      w.backlog += Buffer.byteLength(frame);
      if (w.backlog > options.maxBufferedBytes) {
        deps.logger.info('slow watcher cut off');
        cut(w);
        return;
      }
      w.res.onWritable(() => {
        w.backlog = 0;
        return true;
      });
    }
  }

  app.get('/api/conversations/:id/stream', (res: HttpResponse, req: HttpRequest) => {
    const conversationId = req.getParameter(0) ?? '';
    const ip = canonicalIp(Buffer.from(res.getRemoteAddressAsText()).toString());
    const authorization = req.getHeader('authorization');
    const cookie = req.getHeader('cookie');
    const lastEventId = req.getHeader('last-event-id') || req.getQuery('last_event_id') || '';
    const wait = req.getQuery('wait') === 'true';
    const streamsParam = req.getQuery('streams') ?? '';
    const withBlocks = req.getQuery('blocks') === 'true';
    const origin = req.getHeader('origin');
    const allowOrigin = origin && deps.corsOrigins.includes(origin) ? origin : undefined;
    const admit = admitFor(ip, req.getUrl());
    const w: Watcher = { res, lastEventAt: Date.now(), lastBeatAt: Date.now(), backlog: 0, closed: false };
    res.onAborted(() => {
      w.closed = true;
      w.stop?.();
      watchers.delete(w);
    });

    void (async () => {
      const refused = await admit();
      if (w.closed) return;
      if (refused) return void res.cork(() => writeError(res, refused));
      let principal: Principal | undefined;
      try {
        principal = await authenticate(deps.sql, authorization, cookie, ip);
      } catch (err) {
        if (!w.closed) res.cork(() => writeError(res, err instanceof ApiError ? err : new ApiError('internal_error')));
        return;
      }
      if (w.closed) return;
      if (!principal) return void res.cork(() => writeError(res, new ApiError('unauthorized')));
      if (principal.actor === 'sprite' && principal.conversationId !== conversationId) {
        return void res.cork(() => writeError(res, new ApiError('not_found', 'Conversation not found.')));
      }
      const streams = streamsParam ? streamsParam.split(',').map((s) => s.trim()) : undefined;
      if (streams?.some((s) => !(LOG_STREAMS as readonly string[]).includes(s))) {
        return void res.cork(() =>
          writeError(res, new ApiError('invalid_request', `streams is a list of ${LOG_STREAMS.join(', ')}.`)),
        );
      }
      const after = /^\d+$/.test(lastEventId) ? Number(lastEventId) : 0;
      const conversation = await conversations.getConversation(deps.sql, principal.accountId, conversationId);
      if (w.closed) return;
      if (!conversation)
        return void res.cork(() => writeError(res, new ApiError('not_found', 'Conversation not found.')));

      res.cork(() => {
        res.writeStatus('200 OK');
        res.writeHeader('content-type', 'text/event-stream; charset=utf-8');
        res.writeHeader('cache-control', 'no-cache, no-transform');
        res.writeHeader('x-accel-buffering', 'no');
        if (allowOrigin) {
          res.writeHeader('access-control-allow-origin', allowOrigin);
          res.writeHeader('vary', 'Origin');
        }
        res.write(': connected\n\n');
      });
      watchers.add(w);

      // Live: a turn's end closes a wait=false stream, the conversation's end closes any.
      let replaying = true;
      const onEvents = (events: LogEvent[]) => {
        if (w.closed) return;
        let frames = '';
        let ending = false;
        for (const e of events) {
          if (e.conversationId !== conversationId) continue;
          if (!streams || streams.includes(e.stream))
            frames += `id: ${e.id}\ndata: ${JSON.stringify(shapeEvent(e, withBlocks))}\n\n`;
          if (e.kind === 'stage' && !replaying) {
            if (e.stage === 'terminate' && e.state === 'done') ending = true;
            if (!wait && e.stage === 'turn' && TURN_ENDS.has(e.state ?? '')) ending = true;
          }
        }
        if (frames) {
          w.lastEventAt = Date.now();
          send(w, frames);
        }
        if (ending) end(w);
      };
      const tenant = principal.accountId;
      w.stop = await follow(deps.log, tenant, after, onEvents, {
        read: (from, limit) => readLog(deps, tenant, { conversationId, after: from, limit }),
      });
      replaying = false;
      // History is out. wait=false ends now unless a turn is running; a terminated
      // conversation has nothing more to say either way.
      const now = await conversations.getConversation(deps.sql, tenant, conversationId);
      if (!now || now.status === 'terminated' || (!wait && now.status !== 'running')) end(w);
    })().catch((err) => {
      deps.logger.error({ err }, 'stream failed');
      if (!w.closed) cut(w);
    });
  });

  return {
    close() {
      clearInterval(timer);
      for (const w of [...watchers]) end(w);
    },
    get watchers() {
      return watchers.size;
    },
  };
}

async function authenticate(
  sql: Sql,
  authorization: string,
  cookie: string,
  ip: string,
): Promise<Principal | undefined> {
  if (authorization) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(authorization);
    return m?.[1] ? authenticateBearer(sql, m[1], ip) : undefined;
  }
  const session = cookie ? cookieValue(cookie, 'svc_session') : undefined;
  return session ? authenticateSession(sql, session, ip) : undefined;
}
