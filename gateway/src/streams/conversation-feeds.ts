import type { BatchSink } from '../log/follow.ts';
import type { EventLog, LiveBatch, LogEvent } from '../log/log.ts';

interface TenantFeed {
  /** Resolves to the function that ends the node's one subscription to the tenant. */
  subscribed: Promise<() => void>;
  byConversation: Map<string, Set<BatchSink>>;
  watchers: number;
}

/**
 * The live feed of single conversations, routed on the node: one log subscription per tenant
 * with conversation watchers here, and each batch handed only to the watchers of the
 * conversations it touches. Without it every watcher of a tenant sees every batch of the
 * tenant and filters it, so an event costs as much as the tenant has watchers on the node
 * (a thousand, when a tenant follows a hundred conversations ten times each).
 *
 * Same promise as `EventLog.subscribe`, narrowed to one conversation: from the moment
 * `subscribe` is called, every later batch with events of the conversation is delivered, in
 * id order, carrying only those events; `prev` is the batch's as published.
 */
export class ConversationFeeds {
  private readonly tenants = new Map<string, TenantFeed>();

  constructor(private readonly log: EventLog) {}

  async subscribe(tenant: string, conversationId: string, sink: BatchSink): Promise<() => void> {
    let feed = this.tenants.get(tenant);
    if (!feed) {
      const created: TenantFeed = { subscribed: Promise.resolve(() => {}), byConversation: new Map(), watchers: 0 };
      created.subscribed = this.log.subscribe(tenant, (batch) => dispatch(created, batch));
      // A subscription that failed is forgotten, so the next watcher tries again.
      created.subscribed.catch(() => {
        if (this.tenants.get(tenant) === created) this.tenants.delete(tenant);
      });
      feed = created;
      this.tenants.set(tenant, feed);
    }
    const f = feed;
    let handlers = f.byConversation.get(conversationId);
    if (!handlers) {
      handlers = new Set();
      f.byConversation.set(conversationId, handlers);
    }
    handlers.add(sink);
    f.watchers++;
    const stop = { done: false };
    try {
      await f.subscribed;
    } catch (err) {
      this.leave(tenant, conversationId, f, sink, stop);
      throw err;
    }
    return () => this.leave(tenant, conversationId, f, sink, stop);
  }

  private leave(tenant: string, conversationId: string, f: TenantFeed, sink: BatchSink, stop: { done: boolean }) {
    if (stop.done) return;
    stop.done = true;
    const h = f.byConversation.get(conversationId);
    h?.delete(sink);
    if (h?.size === 0) f.byConversation.delete(conversationId);
    if (--f.watchers === 0 && this.tenants.get(tenant) === f) {
      this.tenants.delete(tenant);
      void f.subscribed.then((end) => end()).catch(() => {});
    }
  }
}

function dispatch(feed: TenantFeed, batch: LiveBatch): void {
  const { events } = batch;
  // The common case: a batch of one conversation goes on as it is.
  const first = (events[0] as LogEvent | undefined)?.conversationId;
  if (events.every((e) => e.conversationId === first)) {
    if (first == null) return;
    for (const h of feed.byConversation.get(first) ?? []) h.onBatch(batch);
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
    for (const h of feed.byConversation.get(conversationId) ?? []) h.onBatch(narrowed);
  }
}
