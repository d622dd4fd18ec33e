import type { BatchSink } from '../log/follow.ts';
import type { EventLog, LiveBatch, LogEvent } from '../log/log.ts';

/** What a watcher follows live: one conversation of the tenant, or (null) all of the tenant's log. */
export type FeedScope = string | null;

interface TenantFeed {
  /** Resolves to the function that ends the node's one subscription to the tenant. */
  subscribed: Promise<() => void>;
  /** Watchers of the whole tenant log (the multiplexed streams): every batch as published. */
  whole: Set<BatchSink>;
  byConversation: Map<string, Set<BatchSink>>;
  watchers: number;
}

/**
 * The live feed of the node's streams: one log subscription per tenant with watchers here,
 * each batch handed to the tenant's whole-log watchers as it is and, narrowed, only to the
 * watchers of the conversations it touches. Without it every conversation watcher of a tenant
 * sees every batch of the tenant and filters it, so an event costs as much as the tenant has
 * watchers on the node (a thousand, when a tenant follows a hundred conversations ten times
 * each); and every watcher would hold a subscription of its own.
 *
 * Same promise as `EventLog.subscribe`, narrowed to the scope: from the moment `subscribe` is
 * called, every later batch with events in scope is delivered, in id order, carrying only
 * those events; `prev` is the batch's as published. A watcher lets go with `unsubscribe` (the
 * same sink), so it holds no function of its own for it.
 */
export class LiveFeeds {
  private readonly tenants = new Map<string, TenantFeed>();

  constructor(private readonly log: EventLog) {}

  async subscribe(tenant: string, scope: FeedScope, sink: BatchSink): Promise<void> {
    let feed = this.tenants.get(tenant);
    if (!feed) {
      const created: TenantFeed = {
        subscribed: Promise.resolve(() => {}),
        whole: new Set(),
        byConversation: new Map(),
        watchers: 0,
      };
      created.subscribed = this.log.subscribe(tenant, (batch) => dispatch(created, batch));
      // A subscription that failed is forgotten, so the next watcher tries again.
      created.subscribed.catch(() => {
        if (this.tenants.get(tenant) === created) this.tenants.delete(tenant);
      });
      feed = created;
      this.tenants.set(tenant, feed);
    }
    const f = feed;
    if (scope === null) f.whole.add(sink);
    else {
      let sinks = f.byConversation.get(scope);
      if (!sinks) {
        sinks = new Set();
        f.byConversation.set(scope, sinks);
      }
      sinks.add(sink);
    }
    f.watchers++;
    try {
      await f.subscribed;
    } catch (err) {
      this.unsubscribe(tenant, scope, sink);
      throw err;
    }
  }

  /** Stops delivering to `sink`; the tenant's subscription ends with its last watcher. A second call does nothing. */
  unsubscribe(tenant: string, scope: FeedScope, sink: BatchSink): void {
    const f = this.tenants.get(tenant);
    if (!f) return;
    if (scope === null) {
      if (!f.whole.delete(sink)) return;
    } else {
      const sinks = f.byConversation.get(scope);
      if (!sinks?.delete(sink)) return;
      if (sinks.size === 0) f.byConversation.delete(scope);
    }
    if (--f.watchers === 0) {
      this.tenants.delete(tenant);
      void f.subscribed.then((end) => end()).catch(() => {});
    }
  }
}

function dispatch(feed: TenantFeed, batch: LiveBatch): void {
  for (const sink of feed.whole) sink.onBatch(batch);
  if (feed.byConversation.size === 0) return;
  const { events } = batch;
  // The common case: a batch of one conversation goes on as it is.
  const first = (events[0] as LogEvent | undefined)?.conversationId;
  if (events.every((e) => e.conversationId === first)) {
    if (first == null) return;
    for (const sink of feed.byConversation.get(first) ?? []) sink.onBatch(batch);
    return;
  }
  const parts = new Map<string, LogEvent[]>();
  for (const e of events) {
    if (e.conversationId === null || !feed.byConversation.has(e.conversationId)) continue;
    const part = parts.get(e.conversationId);
    if (part) part.push(e);
    else parts.set(e.conversationId, [e]);
  }
  for (const [conversationId, part] of parts) {
    const narrowed = { ...batch, events: part };
    for (const sink of feed.byConversation.get(conversationId) ?? []) sink.onBatch(narrowed);
  }
}
