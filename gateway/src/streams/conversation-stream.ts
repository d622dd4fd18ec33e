import { ApiError, ConversationStreamQuery, streamList } from '@svc/core';
import { conversations } from '@svc/db';
import { type BatchSink, follow } from '../log/follow.ts';
import type { LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { shapeEvent } from '../services/conversations.ts';
import { cachedFrame, frame } from './framing.ts';
import type { LiveFeeds } from './live-feeds.ts';
import type { Opening, StreamResponse } from './response.ts';
import type { StreamDeps, Watcher, WatcherRegistry } from './watchers.ts';

const TURN_ENDS = new Set(['done', 'failed', 'interrupted', 'timeout']);

/**
 * `GET /api/conversations/:id/stream`: one conversation's events after Last-Event-ID, then
 * live without a gap. `wait=false` (default) ends the response once the conversation has no
 * running turn; `wait=true` stays open across turns until the conversation terminates or the
 * idle close. Another tenant's conversation is 404 before any byte of stream; the
 * conversation's own sandbox token may watch it.
 */
export function serveConversationStream(
  deps: StreamDeps,
  registry: WatcherRegistry,
  feeds: LiveFeeds,
  res: StreamResponse,
  opening: Opening,
  conversationId: string,
): void {
  registry.open(
    res,
    opening,
    ConversationStreamQuery,
    async ({ w, principal, query, after }) => {
      const tenant = principal.accountId;
      const feed = new ConversationFeed(
        registry,
        feeds,
        w,
        tenant,
        conversationId,
        streamList(query.streams),
        query.blocks === 'true',
        query.wait === 'true',
      );
      // Set before follow() subscribes (synchronously, on its first step), so a watcher that
      // closes at any point from here lets go of its subscription.
      w.following = feed;
      await follow(deps.log, tenant, after, feed, {
        read: (from, limit) => readLog(deps, tenant, { conversationId, after: from, limit }),
        subscribe: (sink) => feed.subscribe(sink),
        paced: () => registry.drained(w),
        cancelled: () => w.closed,
      });
      if (w.closed) return;
      feed.replaying = false;
      registry.live(w);
      // History is out. wait=false ends now unless a turn is running; a terminated
      // conversation has nothing more to say either way.
      const now = await conversations.getConversation(deps.sql, tenant, conversationId);
      if (!now || now.status === 'terminated' || (!feed.wait && now.status !== 'running')) registry.end(w);
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
}

/**
 * One watcher of a conversation stream. A class rather than closures: a node holds one per
 * watcher for as long as it watches, and methods live once on the prototype (tsx names every
 * closure bound to a name, which costs each a property store).
 */
class ConversationFeed {
  /** While history is read (follow() has not returned), events are this watcher's own. */
  replaying = true;
  private readonly shape: string;
  /** What follow() subscribed with, to let go of it. */
  private sink: BatchSink | undefined;
  constructor(
    private readonly registry: WatcherRegistry,
    private readonly feeds: LiveFeeds,
    private readonly w: Watcher,
    private readonly tenant: string,
    private readonly conversationId: string,
    private readonly streams: string[] | undefined,
    private readonly withBlocks: boolean,
    /** wait=true: the stream stays open across turns. */
    readonly wait: boolean,
  ) {
    this.shape = withBlocks ? 'conversation:blocks' : 'conversation';
  }

  subscribe(sink: BatchSink): Promise<undefined> {
    this.sink = sink;
    return this.feeds.subscribe(this.tenant, this.conversationId, sink).then(() => undefined);
  }

  /** The watcher closed (Following). */
  stop(): void {
    if (this.sink) this.feeds.unsubscribe(this.tenant, this.conversationId, this.sink);
  }

  /** Live: a turn's end closes a wait=false stream, the conversation's end closes any. */
  onEvents(events: LogEvent[]): void {
    const { w, conversationId, streams, withBlocks, replaying } = this;
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
          const f = cachedFrame(this.shape, e, () => frame(e.id, shapeEvent(e, withBlocks)));
          frames += f.text;
          alone = f.bytes;
        }
        count++;
        last = e.id;
      }
      if (e.kind === 'stage' && !replaying) {
        if (e.stage === 'terminate' && e.state === 'done') ending = true;
        if (!this.wait && e.stage === 'turn' && TURN_ENDS.has(e.state ?? '')) ending = true;
      }
    }
    if (count > 0) this.registry.sendEvents(w, count === 1 && alone ? alone : frames, last);
    if (ending) this.registry.end(w);
  }
}
