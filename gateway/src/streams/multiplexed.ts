import { MultiplexedStreamQuery, streamList, TEAM_CHANNEL, type TenantEventKind } from '@svc/core';
import { type BatchSink, follow } from '../log/follow.ts';
import type { LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { shapeEvent } from '../services/conversations.ts';
import type { ConversationDirectory, ConversationInfo } from './directory.ts';
import { cachedFrame, frame } from './framing.ts';
import type { LiveFeeds } from './live-feeds.ts';
import type { Opening, StreamResponse } from './response.ts';
import { CONVERSATIONS_EVENT_EVERY_MS, type StreamDeps, type Watcher, type WatcherRegistry } from './watchers.ts';

/** Events a multiplexed watcher may have waiting for conversation lookups before it is cut off. */
const MAX_QUEUED_EVENTS = 10_000;

/**
 * A stream over many conversations of the tenant. `select` says whether a conversation's
 * events belong on it and what they add (`conversation_id`, `agent_id`); `kinds` are the
 * tenant events it carries.
 */
export interface MultiplexedRoute {
  path: string;
  kinds: ReadonlySet<TenantEventKind>;
  select: (id: string, info: ConversationInfo) => Record<string, string> | undefined;
}

/** `/api/events/stream`: every conversation of the caller, and `conversations` changes. */
export const EVENTS_STREAM: MultiplexedRoute = {
  path: '/api/events/stream',
  kinds: new Set(['conversations']),
  select: (id) => ({ conversation_id: id }),
};

/** `/api/team/stream`: the team channel's conversations, and `team` / `schedule` changes. */
export const TEAM_STREAM: MultiplexedRoute = {
  path: '/api/team/stream',
  kinds: new Set(['team', 'schedule']),
  select: (id, info) => (info.channelId === TEAM_CHANNEL ? { conversation_id: id, agent_id: info.agentId } : undefined),
};

/** What every multiplexed watcher of the node shares. */
export interface MultiplexedContext {
  deps: StreamDeps;
  registry: WatcherRegistry;
  directory: ConversationDirectory;
  feeds: LiveFeeds;
}

/**
 * Serves a multiplexed stream. Without Last-Event-ID it starts live (the client lists
 * first); with it, it replays every event after that id, once, in order. Either way a bare
 * `id: <position>` follows `: connected`, so a client that drops before its first event
 * resumes from the moment it connected. Sandbox tokens may not open it.
 */
export function serveMultiplexed(
  ctx: MultiplexedContext,
  route: MultiplexedRoute,
  res: StreamResponse,
  opening: Opening,
): void {
  const { deps, registry, directory } = ctx;
  registry.open(res, opening, MultiplexedStreamQuery, async ({ w, principal, query, after: resumeAfter, resumed }) => {
    const tenant = principal.accountId;
    const start = (after: number) => {
      w.position = Math.max(w.position, after);
      w.told = Math.max(w.told, after);
      // A bare id moves the client's last event id without firing an event (WHATWG dispatch),
      // so a client that drops before its first event resumes from the moment it connected
      // instead of from now, losing what happened while it was away.
      registry.send(w, `id: ${after}\n\n`);
    };
    if (resumed) start(resumeAfter);
    const feed = new MultiplexedFeed(ctx, w, route, tenant, streamList(query.streams), query.blocks === 'true');
    directory.acquire(tenant);
    // Set before follow() subscribes (synchronously, on its first step), so a watcher that
    // closes at any point from here lets go of its subscription and of the directory.
    w.following = feed;
    // Not resumed: from the tenant's last id once subscribed, with no history to read.
    await follow(deps.log, tenant, resumed ? resumeAfter : 'now', feed, {
      onStart: start,
      read: (from, limit) => readLog(deps, tenant, { after: from, limit }),
      subscribe: (sink) => feed.subscribe(sink),
      paced: () => feed.paced(),
      cancelled: () => w.closed,
    });
    feed.replaying = false;
    registry.live(w);
  });
}

/**
 * One watcher of a multiplexed stream. Events of conversations not known yet wait, in order,
 * for one directory lookup shared by the node's watchers of the tenant. A class rather than
 * closures: a node holds one per watcher for as long as it watches, and methods live once on
 * the prototype (tsx names every closure it creates, which costs each a property store).
 */
class MultiplexedFeed {
  /** Events wait here, in order, while the conversation of the first is looked up. */
  private readonly queue: LogEvent[] = [];
  private pumping = false;
  /** Called once the pump has sent the queue (a replay waiting to go on). */
  private onPumped: (() => void) | undefined;
  /** While history is read (follow() has not returned), events are this watcher's own. */
  replaying = true;
  /** What follow() subscribed with, to let go of it; and whether the watcher closed. */
  private sink: BatchSink | undefined;
  private stopped = false;
  constructor(
    private readonly ctx: MultiplexedContext,
    private readonly w: Watcher,
    private readonly route: MultiplexedRoute,
    private readonly tenant: string,
    private readonly streams: string[] | undefined,
    private readonly withBlocks: boolean,
  ) {}

  subscribe(sink: BatchSink): Promise<undefined> {
    this.sink = sink;
    return this.ctx.feeds.subscribe(this.tenant, null, sink).then(() => undefined);
  }

  /** The watcher closed (Following): lets go of the tenant's feed and directory, once. */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    if (this.sink) this.ctx.feeds.unsubscribe(this.tenant, null, this.sink);
    this.ctx.directory.release(this.tenant);
  }

  onEvents(events: LogEvent[]): void {
    const { w, queue } = this;
    if (w.closed) return;
    for (const e of events) queue.push(e);
    if (queue.length > MAX_QUEUED_EVENTS) {
      this.ctx.deps.logger.info('stream watcher fell behind its lookups; cut off');
      this.ctx.registry.cut(w);
      return;
    }
    if (this.pumping) return;
    this.render();
    if (queue.length > 0) {
      this.pump().catch((err) => {
        this.ctx.deps.logger.error({ err }, 'stream lookup failed');
        this.ctx.registry.cut(w);
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
    if (!this.pumping) return this.ctx.registry.drained(this.w);
    return new Promise<void>((resolve) => {
      this.onPumped = resolve;
    }).then(() => this.ctx.registry.drained(this.w));
  }

  /** Sends what is queued, in order, up to the first event whose conversation is unknown. */
  private render(): void {
    const { w, queue, tenant, streams, withBlocks, route } = this;
    const { directory, registry } = this.ctx;
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
    if (count > 0) registry.sendEvents(w, count === 1 && alone ? alone : frames, last);
  }

  /** Looks up what the queue waits for, one query for all of it, until the queue is sent. */
  private async pump(): Promise<void> {
    const { w, queue, tenant } = this;
    const { directory } = this.ctx;
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
