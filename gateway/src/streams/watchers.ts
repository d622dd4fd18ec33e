import { ApiError } from '@svc/core';
import type { Sql } from '@svc/db';
import { parseCookie } from 'cookie';
import type { Logger } from 'pino';
import type { z } from 'zod';
import type { EventLog } from '../log/log.ts';
import { type AuthDeps, authenticateBearer, authenticateSession } from '../services/credentials.ts';
import type { Principal } from '../services/principal.ts';
import { frame } from './framing.ts';
import type { Opening, StreamResponse } from './response.ts';

export interface SseOptions {
  heartbeatMs: number;
  /** Close after this long without an event (heartbeats do not count); 0 never. */
  idleCloseMs: number;
  /** A watcher whose unsent bytes exceed this is cut off; it resumes with Last-Event-ID. */
  maxBufferedBytes: number;
  /** Streams one account may hold open on this node; one more is 429 `rate_limited`. 0: no ceiling. */
  maxPerAccount?: number;
}

/** How long a stream refused for its account's ceiling is told to wait. */
const CEILING_RETRY_AFTER_S = 10;

export interface StreamDeps extends AuthDeps {
  sql: Sql;
  log: EventLog;
  logger: Logger;
  options: SseOptions;
  /** API_CORS_ORIGINS: origins whose browsers may read streams (with a bearer key). */
  corsOrigins: readonly string[];
}

/** How long a registry remembers that an account's streams were ended (longer than any opening takes). */
const ENDED_ACCOUNT_MEMORY_MS = 10 * 60_000;

/** SPEC: the `conversations` event is sent at most once a second per stream. */
export const CONVERSATIONS_EVENT_EVERY_MS = 1000;

/** What a watcher follows once it is live: stopped when the watcher closes. */
export interface Following {
  stop(): void;
}

/**
 * One open stream. All watchers share one timer (no per-watcher timers). A class: a node holds
 * one per open stream, and it is its own response's abort target (no closure per stream).
 */
export class Watcher {
  /** The account it streams for, once its credential was checked. */
  accountId: string | undefined = undefined;
  /** It holds one of its account's places on this node (WatcherRegistry.maxPerAccount). */
  placed = false;
  /** When the last event (or `conversations` event) was sent. */
  lastEventAt: number;
  /**
   * When a heartbeat is due: heartbeatMs after the last event or heartbeat. A heartbeat fills
   * a silence; a watcher sent events more often than that never gets one. The first is due at
   * a random moment within heartbeatMs of the opening, so that watchers that opened together
   * (a reconnect storm after a deploy) do not all beat in the same tick, every time.
   */
  beatAt: number;
  /** Bytes handed to the transport while it reported backpressure. */
  backlog = 0;
  closed = false;
  /** The last tenant id this watcher has been brought up to (sent, or passed over by its filters). */
  position = 0;
  /** The last id the client was told (`id:` line); a heartbeat tells it `position` when ahead. */
  told = 0;
  /** When the last `conversations` event went out, and whether one waits for its turn. */
  conversationsSentAt = 0;
  conversationsPending = false;
  /** Its feed, stopped when it closes (set by the stream's body). */
  following: Following | undefined = undefined;
  /** True while its history is sent: paced by the client (drained()), not cut off. */
  replaying = true;
  /** Called once the socket drained (a replay waiting for its next page). */
  onDrained: (() => void) | undefined = undefined;

  constructor(
    readonly res: StreamResponse,
    private readonly registry: WatcherRegistry,
    now: number,
    beatAt: number,
  ) {
    this.lastEventAt = now;
    this.beatAt = beatAt;
  }

  /** Its client went away (the transport's abort). */
  aborted(): void {
    this.registry.lost(this);
  }
}

/** What a stream's body gets once its opening checks passed and `: connected` went out. */
export interface Opened<Q> {
  w: Watcher;
  principal: Principal;
  /** The query, parsed by the stream's schema. */
  query: Q;
  /** The Last-Event-ID as a number (0 when none was given). */
  after: number;
  /** Whether the client gave a Last-Event-ID. */
  resumed: boolean;
}

export interface OpenChecks {
  /** The conversation a sandbox token may watch; without it, sandbox tokens are refused. */
  sandbox?: string;
  /** Checks that answer with an error before any byte of stream. */
  prepare?: (principal: Principal) => Promise<void>;
}

/** A query's parameters, each by its first value (as URLSearchParams.get reads it). */
function firstValues(query: URLSearchParams): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of query) if (!(k in out)) out[k] = v;
  return out;
}

/**
 * The open streams of this node and what they share: one timer for heartbeats, idle closes
 * and coalesced `conversations` events; writes corked and paced by backpressure, a watcher
 * too far behind cut off rather than waited for; the common opening (rate limit,
 * authentication, head). Knows nothing of the transport beyond StreamResponse.
 */
export class WatcherRegistry {
  private readonly watchers = new Set<Watcher>();
  /**
   * When endAccount last ran for each account, kept ENDED_ACCOUNT_MEMORY_MS: a stream whose
   * opening was already under way then (authenticated before the suspension) is ended as it
   * joins, instead of escaping the sweep.
   */
  private readonly accountsEnded = new Map<string, number>();
  /** Streams open or opening per account, each holding a place from its authentication on. */
  private readonly perAccount = new Map<string, number>();
  private readonly timer: NodeJS.Timeout;

  constructor(private readonly deps: StreamDeps) {
    const { options } = deps;
    const tickMs = Math.max(
      10,
      Math.min(250, Math.floor(Math.min(options.heartbeatMs, options.idleCloseMs || options.heartbeatMs) / 4)),
    );
    this.timer = setInterval(() => this.tick(), tickMs);
    this.timer.unref();
  }

  get size(): number {
    return this.watchers.size;
  }

  private tick(): void {
    const { options } = this.deps;
    const now = Date.now();
    for (const [accountId, at] of this.accountsEnded) {
      if (now - at > ENDED_ACCOUNT_MEMORY_MS) this.accountsEnded.delete(accountId);
    }
    for (const w of this.watchers) {
      if (w.closed) continue;
      if (w.conversationsPending && now - w.conversationsSentAt >= CONVERSATIONS_EVENT_EVERY_MS) {
        this.sendConversationsEvent(w, now);
      }
      // A watcher whose history is still being read or sent is not idle, however long that
      // takes (a slow reader, a long read from Postgres on a loaded node): its idle time
      // counts from its last event once it is live.
      if (options.idleCloseMs > 0 && !w.replaying && now - w.lastEventAt >= options.idleCloseMs) {
        this.end(w);
      } else if (now >= w.beatAt) {
        // (Beating every watcher on its own clock regardless of its events wrote to all of
        // them in a few ticks when they had opened together, a stall of every live delivery.)
        w.beatAt = now + options.heartbeatMs;
        // A bare id line moves the client's last event id without firing an event.
        const id = w.position > w.told ? `id: ${w.position}\n` : '';
        w.told = Math.max(w.told, w.position);
        this.send(w, `: heartbeat\n${id}\n`);
      }
    }
  }

  /** Ends every stream (the node stops) and the shared timer. */
  close(): void {
    clearInterval(this.timer);
    for (const w of [...this.watchers]) this.end(w);
  }

  /**
   * Ends every stream of the account on this node (it was suspended or deleted); a client
   * that reconnects is refused at the opening (403 `account_suspended`, or 401). Returns how
   * many it ended.
   */
  endAccount(accountId: string): number {
    this.accountsEnded.set(accountId, Date.now());
    let ended = 0;
    for (const w of [...this.watchers]) {
      if (w.accountId !== accountId) continue;
      this.end(w);
      ended++;
    }
    return ended;
  }

  /** Ends a watcher gracefully: the client may reconnect. */
  end(w: Watcher): void {
    this.finish(w, 'end');
  }

  /** Cuts a watcher's connection (too slow, or broken). */
  cut(w: Watcher): void {
    this.finish(w, 'cut');
  }

  private finish(w: Watcher, how: 'end' | 'cut'): void {
    if (w.closed) return;
    w.closed = true;
    w.following?.stop();
    wakeDrained(w);
    this.watchers.delete(w);
    this.unplace(w);
    if (how === 'end') w.res.cork(() => w.res.end());
    else w.res.close();
  }

  /**
   * Writes a frame corked. Live, a watcher that falls too far behind is cut off, never waited
   * for (it resumes with Last-Event-ID). History is paced instead: the next page waits until
   * the socket drained (drained()), so a replaying watcher holds at most one page, and a page
   * larger than the limit does not cut off a client that reads.
   */
  send(w: Watcher, frames: string | Buffer): void {
    if (w.closed) return;
    let ok = true;
    w.res.cork(() => {
      ok = w.res.write(frames);
    });
    if (ok) {
      // A write that went through means the transport holds nothing back any more.
      if (w.backlog > 0) caughtUp(w);
      return;
    }
    const first = w.backlog === 0;
    w.backlog += typeof frames === 'string' ? Buffer.byteLength(frames) : frames.length;
    if (w.backlog > this.deps.options.maxBufferedBytes && !w.replaying) {
      this.deps.logger.info('slow watcher cut off');
      this.cut(w);
      return;
    }
    if (first) w.res.onDrain(() => caughtUp(w));
  }

  /**
   * The watcher's history is out: it is live from now on, cut off rather than waited for when
   * it falls behind, and idle from now until its next event.
   */
  live(w: Watcher): void {
    w.replaying = false;
    w.lastEventAt = Date.now();
  }

  /** Resolves once the watcher's socket took what was written (undefined when it has). */
  drained(w: Watcher): Promise<void> | undefined {
    if (w.closed || w.backlog === 0) return undefined;
    return new Promise<void>((resolve) => {
      w.onDrained = resolve;
    });
  }

  /** Sends events (frames with ids) and records what the client now knows. */
  sendEvents(w: Watcher, frames: string | Buffer, lastId: number): void {
    w.lastEventAt = Date.now();
    w.beatAt = w.lastEventAt + this.deps.options.heartbeatMs;
    w.told = Math.max(w.told, lastId);
    this.send(w, frames);
  }

  /** The coalesced `conversations` event: its id is the position, so the client's id never goes back. */
  sendConversationsEvent(w: Watcher, now: number): void {
    w.conversationsPending = false;
    w.conversationsSentAt = now;
    this.sendEvents(w, frame(w.position, { reason: 'changed' }, 'conversations'), w.position);
  }

  /**
   * Common opening of every stream: rate limit, authentication (bearer key or session cookie;
   * a sandbox token only where `checks.sandbox` allows), the checks of `prepare` (which answer
   * with an error before any byte of stream), then the stream's head and `: connected`, then
   * `run` (which sets `w.following`).
   */
  open<Q extends { last_event_id?: string | undefined }>(
    res: StreamResponse,
    o: Opening,
    schema: z.ZodType<Q>,
    run: (opened: Opened<Q>) => Promise<void>,
    checks: OpenChecks = {},
  ): void {
    const { deps } = this;
    const allowOrigin = o.origin && deps.corsOrigins.includes(o.origin) ? o.origin : undefined;
    const now = Date.now();
    const w = new Watcher(res, this, now, now + Math.floor(Math.random() * deps.options.heartbeatMs));
    res.onAborted(w);

    void (async () => {
      const refused = await o.admit();
      if (w.closed) return;
      if (refused) return void res.cork(() => res.error(refused));
      let principal: Principal | undefined;
      let query: Q;
      let lastEventId = '';
      try {
        principal = await authenticate(deps, o.authorization, o.cookie, o.ip);
        if (w.closed) return;
        if (!principal) throw new ApiError('unauthorized');
        this.place(w, principal.accountId);
        if (principal.actor === 'sprite' && checks.sandbox === undefined) {
          throw new ApiError('forbidden', 'A sandbox token may not use this stream.');
        }
        if (principal.actor === 'sprite' && principal.conversationId !== checks.sandbox) {
          throw new ApiError('not_found', 'Conversation not found.');
        }
        const parsed = schema.safeParse(firstValues(o.query));
        if (!parsed.success) throw new ApiError('invalid_request', parsed.error.issues[0]?.message);
        query = parsed.data;
        lastEventId = o.lastEventId || query.last_event_id || '';
        if (lastEventId !== '' && !isEventId(lastEventId)) {
          throw new ApiError(
            'invalid_request',
            `Last-Event-ID must be the id of an event (a whole number), not ${lastEventId.length > 40 ? `${lastEventId.length} characters` : JSON.stringify(lastEventId)}.`,
          );
        }
        await checks.prepare?.(principal);
      } catch (err) {
        this.unplace(w);
        if (!w.closed) res.cork(() => res.error(err instanceof ApiError ? err : new ApiError('internal_error')));
        if (!(err instanceof ApiError)) deps.logger.error({ err }, 'stream refused');
        return;
      }
      if (w.closed) return;
      w.accountId = principal.accountId;
      const resumed = lastEventId !== '';
      const after = resumed ? Number(lastEventId) : 0;
      w.position = after;
      w.told = after;
      // Idle time counts from the stream's opening, not from the request's arrival: an opening
      // slowed by load (authentication, its checks) must not be idle-closed before it sends.
      w.lastEventAt = Date.now();
      res.cork(() => {
        res.writeHead({
          'content-type': 'text/event-stream; charset=utf-8',
          'cache-control': 'no-cache, no-transform',
          'x-accel-buffering': 'no',
          ...(allowOrigin ? { 'access-control-allow-origin': allowOrigin, vary: 'Origin' } : {}),
        });
        res.write(': connected\n\n');
      });
      this.watchers.add(w);
      // Its account's streams were ended while this one was opening: it goes too.
      if ((this.accountsEnded.get(principal.accountId) ?? Number.NEGATIVE_INFINITY) >= now) return this.end(w);
      await run({ w, principal, query, after, resumed });
    })().catch((err) => {
      deps.logger.error({ err }, 'stream failed');
      if (!w.closed) this.cut(w);
    });
  }

  /** Forgets a watcher whose client went away (Watcher.aborted). */
  lost(w: Watcher): void {
    if (w.closed) return;
    w.closed = true;
    w.following?.stop();
    // A replay waiting for the socket to drain stops now, and so lets go of its subscription.
    wakeDrained(w);
    this.watchers.delete(w);
    this.unplace(w);
  }

  /**
   * Takes one of the account's places on this node for the watcher, or refuses it with 429
   * `rate_limited` (and Retry-After) when the account holds maxPerAccount streams here already:
   * one tenant cannot take a node's watchers.
   */
  private place(w: Watcher, accountId: string): void {
    const max = this.deps.options.maxPerAccount ?? 0;
    const open = this.perAccount.get(accountId) ?? 0;
    if (max > 0 && open >= max) {
      throw new ApiError(
        'rate_limited',
        `This account has ${max} event streams open on this node, its limit (SSE_MAX_STREAMS_PER_ACCOUNT): close one, or retry later.`,
        { retryAfter: CEILING_RETRY_AFTER_S, extra: { limit: max } },
      );
    }
    this.perAccount.set(accountId, open + 1);
    w.accountId = accountId;
    w.placed = true;
  }

  /** Gives the watcher's place back (idempotent). */
  private unplace(w: Watcher): void {
    if (!w.placed || w.accountId === undefined) return;
    w.placed = false;
    const left = (this.perAccount.get(w.accountId) ?? 1) - 1;
    if (left > 0) this.perAccount.set(w.accountId, left);
    else this.perAccount.delete(w.accountId);
  }
}

/** An event id as a client may resume from: a whole number the log's ids can reach. */
function isEventId(text: string): boolean {
  return /^\d{1,16}$/.test(text) && Number(text) <= Number.MAX_SAFE_INTEGER;
}

/** Everything written reached the socket: a replay waiting for it goes on. */
function caughtUp(w: Watcher): void {
  w.backlog = 0;
  wakeDrained(w);
}

function wakeDrained(w: Watcher): void {
  const wake = w.onDrained;
  w.onDrained = undefined;
  wake?.();
}

async function authenticate(
  deps: AuthDeps,
  authorization: string,
  cookie: string,
  ip: string,
): Promise<Principal | undefined> {
  if (authorization) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(authorization);
    return m?.[1] ? authenticateBearer(deps, m[1], ip) : undefined;
  }
  // Parsed as @fastify/cookie parses it for the API, so a browser's session works on both.
  const session = cookie ? parseCookie(cookie).svc_session : undefined;
  return session ? authenticateSession(deps, session, ip) : undefined;
}
