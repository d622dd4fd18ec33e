import type { HttpRequest, HttpResponse, TemplatedApp } from 'uWebSockets.js';
import { ApiError, LOG_STREAMS, type TenantEventKind } from '@svc/core';
import { conversations, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import { follow } from '../log/follow.ts';
import type { EventLog, LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { shapeEvent } from '../services/conversations.ts';
import { authenticateBearer, authenticateSession } from '../services/credentials.ts';
import type { Principal } from '../services/principal.ts';
import { canonicalIp } from './client-ip.ts';
import { ConversationFeeds } from './conversation-feeds.ts';
import { ConversationDirectory, type ConversationInfo } from './directory.ts';
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
/** SPEC: the `conversations` event is sent at most once a second per stream. */
const CONVERSATIONS_EVENT_EVERY_MS = 1000;
/** The channel of the team roster's conversations. */
const TEAM_CHANNEL = 'svc:team';
/** Events a multiplexed watcher may have waiting for conversation lookups before it is cut off. */
const MAX_QUEUED_EVENTS = 10_000;

/** One open stream. All watchers share one timer (no per-watcher timers). */
interface Watcher {
  res: HttpResponse;
  /** When the last event (or `conversations` event) was sent. */
  lastEventAt: number;
  /**
   * When a heartbeat is due: heartbeatMs after the last event or heartbeat. A heartbeat fills
   * a silence; a watcher sent events more often than that never gets one. The first is due at
   * a random moment within heartbeatMs of the opening, so that watchers that opened together
   * (a reconnect storm after a deploy) do not all beat in the same tick, every time.
   */
  beatAt: number;
  /** Bytes handed to uWS while it reported backpressure. */
  backlog: number;
  closed: boolean;
  /** The last tenant id this watcher has been brought up to (sent, or passed over by its filters). */
  position: number;
  /** The last id the client was told (`id:` line); a heartbeat tells it `position` when ahead. */
  told: number;
  /** When the last `conversations` event went out, and whether one waits for its turn. */
  conversationsSentAt: number;
  conversationsPending: boolean;
  stop: (() => void) | undefined;
  /** True while its history is sent: paced by the client (drained()), not cut off. */
  replaying: boolean;
  /** Called once the socket drained (a replay waiting for its next page). */
  onDrained: (() => void) | undefined;
}

/** What a multiplexed route shares among its watchers. */
interface MultiplexedRoute {
  path: string;
  kinds: ReadonlySet<TenantEventKind>;
  select: (id: string, info: ConversationInfo) => Record<string, string> | undefined;
}

/** What a stream request carries; read before the first await (uWS frees the request then). */
interface Opening {
  ip: string;
  authorization: string;
  cookie: string;
  origin: string;
  lastEventId: string;
  query: URLSearchParams;
  admit: () => Admission;
}

function cookieValue(header: string, name: string): string | undefined {
  for (const part of header.split(';')) {
    const [k, ...v] = part.trim().split('=');
    if (k === name) return v.join('=');
  }
  return undefined;
}

/** The `streams` query as a list (undefined: every stream). */
function streamsOf(query: URLSearchParams): string[] | undefined {
  const s = query.get('streams');
  return s ? s.split(',').map((x) => x.trim()) : undefined;
}

function frame(id: number, data: unknown, event?: string): string {
  return `id: ${id}\n${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`;
}

/** A frame as text (to join with others) and as the bytes written when it goes alone. */
interface CachedFrame {
  text: string;
  bytes: Buffer;
}

/**
 * An event's frame for one shape of a stream (which stream, blocks or not), serialised once
 * per node however many watchers send it: every watcher of a tenant on this node receives
 * the same event objects from the feed, so the frame is cached on the object itself (a
 * WeakMap: it goes when the event does). Its UTF-8 bytes are cached too: a string handed to
 * uWS is encoded again on every write, once per watcher.
 */
const frameCaches = new Map<string, WeakMap<LogEvent, CachedFrame>>();
function cachedFrame(shape: string, e: LogEvent, build: () => string): CachedFrame {
  let cache = frameCaches.get(shape);
  if (!cache) {
    cache = new WeakMap();
    frameCaches.set(shape, cache);
  }
  let f = cache.get(e);
  if (f === undefined) {
    const text = build();
    f = { text, bytes: Buffer.from(text) };
    cache.set(e, f);
  }
  return f;
}

/**
 * Server-Sent Events served by the edge itself (SPEC "Stream events"):
 *
 * - `GET /api/conversations/:id/stream`: one conversation's events. `wait=false` (default)
 *   ends the response once the conversation has no running turn; `wait=true` stays open across
 *   turns until the conversation terminates or the idle close.
 * - `GET /api/events/stream`: every conversation of the caller, with `conversation_id`, and
 *   `conversations` `{reason: changed}` at most once a second.
 * - `GET /api/team/stream`: the team channel's conversations, with `conversation_id` and
 *   `agent_id`, and `team` / `schedule` `{reason: changed}`.
 *
 * Each replays after `Last-Event-ID` (header, or `last_event_id` in the query for clients
 * that cannot set headers) and then follows live without a gap (follow()). A multiplexed
 * stream sends a bare `id: <position>` right after `: connected`, so a client that has seen no
 * event yet still resumes from the moment it connected. A heartbeat
 * comment carries `id: <position>` when the watcher has been brought past the last id it was
 * told (its filters skipped events), so a reconnect does not start from far back. Another
 * tenant's conversation is 404 before any byte of stream.
 */
export function registerSse(app: TemplatedApp, deps: SseDeps, admitFor: (ip: string, path: string) => () => Admission) {
  const { options } = deps;
  const watchers = new Set<Watcher>();
  const directory = new ConversationDirectory(deps.sql);
  const conversationFeeds = new ConversationFeeds(deps.log);

  const tickMs = Math.max(
    10,
    Math.min(250, Math.floor(Math.min(options.heartbeatMs, options.idleCloseMs || options.heartbeatMs) / 4)),
  );
  const timer = setInterval(() => {
    const now = Date.now();
    for (const w of watchers) {
      if (w.closed) continue;
      if (w.conversationsPending && now - w.conversationsSentAt >= CONVERSATIONS_EVENT_EVERY_MS) {
        sendConversationsEvent(w, now);
      }
      if (options.idleCloseMs > 0 && now - w.lastEventAt >= options.idleCloseMs) {
        end(w);
      } else if (now >= w.beatAt) {
        // (Beating every watcher on its own clock regardless of its events wrote to all of
        // them in a few ticks when they had opened together, a stall of every live delivery.)
        w.beatAt = now + options.heartbeatMs;
        // A bare id line moves the client's last event id without firing an event.
        const id = w.position > w.told ? `id: ${w.position}\n` : '';
        w.told = Math.max(w.told, w.position);
        send(w, `: heartbeat\n${id}\n`);
      }
    }
  }, tickMs);
  timer.unref();

  /** Ends a watcher: gracefully (`end`, the client may reconnect) or by cutting the socket. */
  function finish(w: Watcher, how: 'end' | 'cut'): void {
    if (w.closed) return;
    w.closed = true;
    w.stop?.();
    wakeDrained(w);
    watchers.delete(w);
    if (how === 'end') w.res.cork(() => w.res.end());
    else w.res.close();
  }
  const end = (w: Watcher) => finish(w, 'end');
  const cut = (w: Watcher) => finish(w, 'cut');

  /**
   * Writes a frame corked. Live, a watcher that falls too far behind is cut off, never waited
   * for (it resumes with Last-Event-ID). History is paced instead: the next page waits until
   * the socket drained (drained()), so a replaying watcher holds at most one page, and a page
   * larger than the limit does not cut off a client that reads.
   */
  function send(w: Watcher, frames: string | Buffer): void {
    if (w.closed) return;
    let ok = true;
    w.res.cork(() => {
      ok = w.res.write(frames);
    });
    if (ok) {
      // A write that went through first flushed whatever uWS still held for the socket.
      if (w.backlog > 0) caughtUp(w);
      return;
    }
    w.backlog += typeof frames === 'string' ? Buffer.byteLength(frames) : frames.length;
    if (w.backlog > options.maxBufferedBytes && !w.replaying) {
      deps.logger.info('slow watcher cut off');
      cut(w);
      return;
    }
    w.res.onWritable(() => flush(w));
  }

  /**
   * The socket can take more. uWS sends what it holds back for a socket only when something is
   * written to it, and stops watching the socket once an onWritable handler returns without a
   * failed write: a handler that wrote nothing left the tail of the last frames in uWS's buffer
   * until the next write, an event or a heartbeat up to heartbeatMs later (a resumed watcher
   * sat silent although its events were on the server). So the handler writes an empty comment
   * line, which pushes the held bytes out first; when they do not all go, uWS keeps watching and
   * calls again. Every write ends a frame, so the comment never lands inside one.
   */
  function flush(w: Watcher): boolean {
    if (w.closed) return true;
    let ok = true;
    w.res.cork(() => {
      ok = w.res.write(':\n\n');
    });
    if (ok) caughtUp(w);
    return ok;
  }

  /** Everything written reached the socket: a replay waiting for it goes on. */
  function caughtUp(w: Watcher): void {
    w.backlog = 0;
    wakeDrained(w);
  }

  /** Resolves once the watcher's socket took what was written (undefined when it has). */
  function drained(w: Watcher): Promise<void> | undefined {
    if (w.closed || w.backlog === 0) return undefined;
    return new Promise<void>((resolve) => {
      w.onDrained = resolve;
    });
  }

  function wakeDrained(w: Watcher): void {
    const wake = w.onDrained;
    w.onDrained = undefined;
    wake?.();
  }

  /** Sends events (frames with ids) and records what the client now knows. */
  function sendEvents(w: Watcher, frames: string | Buffer, lastId: number): void {
    w.lastEventAt = Date.now();
    w.beatAt = w.lastEventAt + options.heartbeatMs;
    w.told = Math.max(w.told, lastId);
    send(w, frames);
  }

  /** The coalesced `conversations` event: its id is the position, so the client's id never goes back. */
  function sendConversationsEvent(w: Watcher, now: number): void {
    w.conversationsPending = false;
    w.conversationsSentAt = now;
    sendEvents(w, frame(w.position, { reason: 'changed' }, 'conversations'), w.position);
  }

  /**
   * Forgets a watcher whose client went away. A function of its own so the handler, which
   * lives as long as the stream, keeps only the watcher alive and not everything the opening
   * read (headers, query, the admission).
   */
  function whenAborted(res: HttpResponse, w: Watcher): void {
    res.onAborted(() => {
      w.closed = true;
      w.stop?.();
      // A replay waiting for the socket to drain stops now, and so lets go of its subscription.
      wakeDrained(w);
      watchers.delete(w);
    });
  }

  /**
   * Common opening of every stream: rate limit, authentication (bearer key or session cookie;
   * a sandbox token only where `sandbox` allows), the checks of `prepare` (which answers with
   * an error before any byte of stream), then the stream's head and `: connected`.
   */
  function open(
    res: HttpResponse,
    req: HttpRequest,
    run: (ctx: {
      w: Watcher;
      principal: Principal;
      query: URLSearchParams;
      after: number;
      /** Whether the client gave a Last-Event-ID (else `after` is 0). */
      resumed: boolean;
    }) => Promise<void>,
    checks: { sandbox?: string; prepare?: (principal: Principal, query: URLSearchParams) => Promise<void> } = {},
  ): void {
    const ip = canonicalIp(Buffer.from(res.getRemoteAddressAsText()).toString());
    const o: Opening = {
      ip,
      authorization: req.getHeader('authorization'),
      cookie: req.getHeader('cookie'),
      origin: req.getHeader('origin'),
      lastEventId: req.getHeader('last-event-id'),
      query: new URLSearchParams(req.getQuery() ?? ''),
      admit: admitFor(ip, req.getUrl()),
    };
    const lastEventId = o.lastEventId || o.query.get('last_event_id') || '';
    const allowOrigin = o.origin && deps.corsOrigins.includes(o.origin) ? o.origin : undefined;
    const now = Date.now();
    const w: Watcher = {
      res,
      lastEventAt: now,
      beatAt: now + Math.floor(Math.random() * options.heartbeatMs),
      backlog: 0,
      closed: false,
      position: 0,
      told: 0,
      conversationsSentAt: 0,
      conversationsPending: false,
      stop: undefined,
      replaying: true,
      onDrained: undefined,
    };
    whenAborted(res, w);

    void (async () => {
      const refused = await o.admit();
      if (w.closed) return;
      if (refused) return void res.cork(() => writeError(res, refused));
      let principal: Principal | undefined;
      try {
        principal = await authenticate(deps.sql, o.authorization, o.cookie, o.ip);
        if (w.closed) return;
        if (!principal) throw new ApiError('unauthorized');
        if (principal.actor === 'sprite' && checks.sandbox === undefined) {
          throw new ApiError('forbidden', 'A sandbox token may not use this stream.');
        }
        if (principal.actor === 'sprite' && principal.conversationId !== checks.sandbox) {
          throw new ApiError('not_found', 'Conversation not found.');
        }
        if (streamsOf(o.query)?.some((s) => !(LOG_STREAMS as readonly string[]).includes(s))) {
          throw new ApiError('invalid_request', `streams is a list of ${LOG_STREAMS.join(', ')}.`);
        }
        await checks.prepare?.(principal, o.query);
      } catch (err) {
        if (!w.closed) res.cork(() => writeError(res, err instanceof ApiError ? err : new ApiError('internal_error')));
        if (!(err instanceof ApiError)) deps.logger.error({ err }, 'stream refused');
        return;
      }
      if (w.closed) return;
      const after = /^\d+$/.test(lastEventId) ? Number(lastEventId) : 0;
      w.position = after;
      w.told = after;
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
      await run({ w, principal, query: o.query, after, resumed: /^\d+$/.test(lastEventId) });
    })().catch((err) => {
      deps.logger.error({ err }, 'stream failed');
      if (!w.closed) cut(w);
    });
  }

  app.get('/api/conversations/:id/stream', (res, req) => {
    const conversationId = req.getParameter(0) ?? '';
    open(
      res,
      req,
      async ({ w, principal, query, after }) => {
        const wait = query.get('wait') === 'true';
        const withBlocks = query.get('blocks') === 'true';
        const streams = streamsOf(query);
        const tenant = principal.accountId;
        // Live: a turn's end closes a wait=false stream, the conversation's end closes any.
        let replaying = true;
        const onEvents = (events: LogEvent[]) => {
          if (w.closed) return;
          let frames = '';
          let alone: Buffer | undefined;
          let count = 0;
          let last = 0;
          let ending = false;
          for (const e of events) {
            w.position = Math.max(w.position, e.id);
            if (e.conversationId !== conversationId) continue;
            if (!streams || streams.includes(e.stream)) {
              // History read for this watcher is its own: caching its frames would only fill the
              // cache (and the collector's work) with entries nobody else meets.
              if (replaying) {
                frames += frame(e.id, shapeEvent(e, withBlocks));
                alone = undefined;
              } else {
                const f = cachedFrame(`conversation:${withBlocks}`, e, () => frame(e.id, shapeEvent(e, withBlocks)));
                frames += f.text;
                alone = f.bytes;
              }
              count++;
              last = e.id;
            }
            if (e.kind === 'stage' && !replaying) {
              if (e.stage === 'terminate' && e.state === 'done') ending = true;
              if (!wait && e.stage === 'turn' && TURN_ENDS.has(e.state ?? '')) ending = true;
            }
          }
          if (count > 0) sendEvents(w, count === 1 && alone ? alone : frames, last);
          if (ending) end(w);
        };
        w.stop = await follow(deps.log, tenant, after, onEvents, {
          read: (from, limit) => readLog(deps, tenant, { conversationId, after: from, limit }),
          subscribe: (onBatch) => conversationFeeds.subscribe(tenant, conversationId, onBatch),
          paced: () => drained(w),
          cancelled: () => w.closed,
        });
        if (w.closed) return w.stop();
        replaying = false;
        w.replaying = false;
        // History is out. wait=false ends now unless a turn is running; a terminated
        // conversation has nothing more to say either way.
        const now = await conversations.getConversation(deps.sql, tenant, conversationId);
        if (!now || now.status === 'terminated' || (!wait && now.status !== 'running')) end(w);
      },
      {
        sandbox: conversationId,
        prepare: async (principal) => {
          if (!(await conversations.getConversation(deps.sql, principal.accountId, conversationId))) {
            throw new ApiError('not_found', 'Conversation not found.');
          }
        },
      },
    );
  });

  /**
   * A stream over many conversations of the tenant. `select` says whether a conversation's
   * events belong on it and what they add (`conversation_id`, `agent_id`); `kinds` are the
   * tenant events it carries. Events of conversations not known yet wait, in order, for one
   * directory lookup shared by the node's watchers of the tenant.
   */
  function multiplexed(
    path: string,
    kinds: ReadonlySet<TenantEventKind>,
    select: (id: string, info: ConversationInfo) => Record<string, string> | undefined,
  ) {
    const route: MultiplexedRoute = { path, kinds, select };
    app.get(path, (res, req) => {
      open(res, req, async ({ w, principal, query, after: resumeAfter, resumed }) => {
        const tenant = principal.accountId;
        // Without Last-Event-ID a multiplexed stream starts live (the client lists first).
        const after = resumed ? resumeAfter : await deps.log.lastId(tenant);
        w.position = Math.max(w.position, after);
        w.told = Math.max(w.told, after);
        // A bare id moves the client's last event id without firing an event (WHATWG dispatch),
        // so a client that drops before its first event resumes from the moment it connected
        // instead of from now, losing what happened while it was away.
        send(w, `id: ${after}\n\n`);
        const release = directory.acquire(tenant);
        const feed = new MultiplexedFeed(w, route, tenant, streamsOf(query), query.get('blocks') === 'true');
        const stop = await follow(deps.log, tenant, after, (events) => feed.onEvents(events), {
          read: (from, limit) => readLog(deps, tenant, { after: from, limit }),
          paced: () => feed.paced(),
          cancelled: () => w.closed,
        });
        feed.replaying = false;
        w.replaying = false;
        w.stop = () => {
          stop();
          release();
        };
        if (w.closed) w.stop();
      });
    });
  }

  /**
   * One watcher of a multiplexed stream. A class rather than closures: a node holds one per
   * watcher for as long as it watches, and methods live once on the prototype (tsx names
   * every closure it creates, which costs each a property store of its own).
   */
  class MultiplexedFeed {
    /** Events wait here, in order, while the conversation of the first is looked up. */
    private readonly queue: LogEvent[] = [];
    private pumping = false;
    /** Called once the pump has sent the queue (a replay waiting to go on). */
    private onPumped: (() => void) | undefined;
    /** While history is read (follow() has not returned), events are this watcher's own. */
    replaying = true;
    constructor(
      private readonly w: Watcher,
      private readonly route: MultiplexedRoute,
      private readonly tenant: string,
      private readonly streams: string[] | undefined,
      private readonly withBlocks: boolean,
    ) {}

    onEvents(events: LogEvent[]): void {
      const { w, queue } = this;
      if (w.closed) return;
      for (const e of events) queue.push(e);
      if (queue.length > MAX_QUEUED_EVENTS) {
        deps.logger.info('stream watcher fell behind its lookups; cut off');
        cut(w);
        return;
      }
      if (this.pumping) return;
      this.render();
      if (queue.length > 0) {
        this.pump().catch((err) => {
          deps.logger.error({ err }, 'stream lookup failed');
          cut(w);
        });
      }
    }

    /**
     * Resolves once what the feed was handed has been written and the socket took it (undefined
     * when it has). History waits on its conversations' lookups before it is written: paced by
     * the socket alone, a replay went live with pages still queued, which were then written as
     * live events and cut the watcher off as too slow, and a long one queued without bound.
     */
    paced(): Promise<void> | undefined {
      if (!this.pumping) return drained(this.w);
      return new Promise<void>((resolve) => {
        this.onPumped = resolve;
      }).then(() => drained(this.w));
    }

    /** Sends what is queued, in order, up to the first event whose conversation is unknown. */
    private render(): void {
      const { w, queue, tenant, streams, withBlocks, route } = this;
      let frames = '';
      let alone: Buffer | undefined;
      let count = 0;
      let last = 0;
      let i = 0;
      for (; i < queue.length; i++) {
        const e = queue[i] as LogEvent;
        if (e.conversationId === null) {
          // A change may have deleted a conversation or moved it off the team channel.
          directory.forget(tenant, e.id);
          w.position = Math.max(w.position, e.id);
          if (!route.kinds.has(e.kind as TenantEventKind)) continue;
          if (e.kind === 'conversations') {
            // At most one a second: the first goes now, later ones fold into one.
            if (Date.now() - w.conversationsSentAt < CONVERSATIONS_EVENT_EVERY_MS) {
              w.conversationsPending = true;
              continue;
            }
            w.conversationsSentAt = Date.now();
            w.conversationsPending = false;
          }
          frames += frame(e.id, JSON.parse(e.data ?? '{}'), e.kind);
          alone = undefined;
          count++;
          last = e.id;
          continue;
        }
        const info = directory.get(tenant, e.conversationId);
        if (info === undefined) break;
        w.position = Math.max(w.position, e.id);
        if (streams && !streams.includes(e.stream)) continue;
        const extra = info ? route.select(e.conversationId, info) : undefined;
        if (!extra) continue;
        // History read for this watcher is its own: its frames are not cached (nobody else meets them).
        if (this.replaying) {
          frames += frame(e.id, Object.assign(shapeEvent(e, withBlocks), extra));
          alone = undefined;
        } else {
          const f = cachedFrame(`${route.path}:${withBlocks}`, e, () =>
            frame(e.id, Object.assign(shapeEvent(e, withBlocks), extra)),
          );
          frames += f.text;
          alone = count === 0 ? f.bytes : undefined;
        }
        count++;
        last = e.id;
      }
      queue.splice(0, i);
      if (count > 0) sendEvents(w, count === 1 && alone ? alone : frames, last);
    }

    /** Looks up what the queue waits for, one query for all of it, until the queue is sent. */
    private async pump(): Promise<void> {
      const { w, queue, tenant } = this;
      this.pumping = true;
      try {
        for (;;) {
          this.render();
          if (queue.length === 0 || w.closed) return;
          const unknown = new Set<string>();
          for (const e of queue) {
            if (e.conversationId !== null && directory.get(tenant, e.conversationId) === undefined) {
              unknown.add(e.conversationId);
            }
          }
          await directory.load(tenant, unknown);
        }
      } finally {
        this.pumping = false;
        const pumped = this.onPumped;
        this.onPumped = undefined;
        pumped?.();
      }
    }
  }

  multiplexed('/api/events/stream', new Set(['conversations']), (id) => ({ conversation_id: id }));
  multiplexed('/api/team/stream', new Set(['team', 'schedule']), (id, info) =>
    info.channelId === TEAM_CHANNEL ? { conversation_id: id, agent_id: info.agentId } : undefined,
  );

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
