import { conversations, type Sql } from '@svc/db';

export interface ConversationInfo {
  agentId: string;
  channelId: string | null;
}

interface TenantEntry {
  users: number;
  /** null: no such conversation (deleted, or another tenant's). */
  known: Map<string, ConversationInfo | null>;
  loading: Map<string, Promise<void>>;
  /** The last change event that cleared `known`. */
  forgottenAt: number;
}

/**
 * What the multiplexed streams need to know about a conversation an event belongs to (does it
 * still exist, its agent, its channel), cached per node per tenant while the tenant has
 * watchers here: a thousand watchers meeting a new conversation cost one query, not a
 * thousand. A change event (`conversations`, `team`) clears the tenant's entries.
 */
export class ConversationDirectory {
  private readonly tenants = new Map<string, TenantEntry>();

  constructor(private readonly sql: Sql) {}

  /** Holds the tenant's cache while a watcher uses it, until its `release` (once per acquire). */
  acquire(tenant: string): void {
    let entry = this.tenants.get(tenant);
    if (!entry) {
      entry = { users: 0, known: new Map(), loading: new Map(), forgottenAt: 0 };
      this.tenants.set(tenant, entry);
    }
    entry.users++;
  }

  release(tenant: string): void {
    const entry = this.tenants.get(tenant);
    if (entry && --entry.users === 0) this.tenants.delete(tenant);
  }

  /** What is known now: info, null for none, undefined when not yet loaded. */
  get(tenant: string, id: string): ConversationInfo | null | undefined {
    return this.tenants.get(tenant)?.known.get(id);
  }

  /** Loads the ids not known yet; ids already being loaded are waited for, not asked twice. */
  async load(tenant: string, ids: Iterable<string>): Promise<void> {
    const entry = this.tenants.get(tenant);
    if (!entry) return;
    const waits: Promise<void>[] = [];
    const ask: string[] = [];
    for (const id of new Set(ids)) {
      if (entry.known.has(id)) continue;
      const pending = entry.loading.get(id);
      if (pending) waits.push(pending);
      else ask.push(id);
    }
    if (ask.length > 0) {
      const query = (async () => {
        const rows = await conversations.lookup(this.sql, tenant, ask);
        const found = new Map(rows.map((r) => [r.id, { agentId: r.agent_id, channelId: r.channel_id }]));
        for (const id of ask) entry.known.set(id, found.get(id) ?? null);
      })().finally(() => {
        for (const id of ask) entry.loading.delete(id);
      });
      for (const id of ask) entry.loading.set(id, query);
      waits.push(query);
    }
    await Promise.all(waits);
  }

  /**
   * Forgets the tenant's entries because of the change event `eventId` (a conversation deleted,
   * a roster change). Every watcher of the tenant meets the same event; only the first one
   * to pass it clears the cache, so the others do not throw away what was loaded since.
   */
  forget(tenant: string, eventId: number): void {
    const entry = this.tenants.get(tenant);
    if (!entry || eventId <= entry.forgottenAt) return;
    entry.forgottenAt = eventId;
    entry.known.clear();
  }
}
