import { accounts, logEvents, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { EventLog } from '../log/log.ts';
import { workThroughDirty } from './dirty-tenants.ts';

export type DurableListener = (tenant: string, marks: ReadonlyMap<string, number>) => void;

/**
 * Copies the hot log into Postgres (DESIGN.md "Producers and durability"). Tenants are
 * tracked when this node appends for them, and at start every tenant with a mark plus every
 * account is checked once, so a copy interrupted by a crash resumes from its mark. Each pass
 * copies what lies above the mark in batches of `batch`, each batch and its mark in one
 * transaction. Copy lag (events appended, not yet copied) is what `lag()` reports for a
 * tenant, and `pending()` for what this process appended.
 */
export class LogCopier {
  private readonly dirty = new Set<string>();
  /** Per tenant appended here and not known copied: since when, and the latest track. */
  private readonly uncopied = new Map<string, { since: number; last: number }>();
  private copiedTotal = 0;
  private readonly listeners: DurableListener[] = [];
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly deps: {
      sql: Sql;
      log: EventLog;
      logger: Logger;
      /**
       * The lowest id a consumer group of the tenant has not acknowledged (undefined: no
       * group): the trim keeps it and what follows, up to `maxHeld` events in the hot tail.
       */
      holds?: (tenant: string) => Promise<number | undefined>;
    },
    private readonly options: { intervalMs: number; batch: number; keepHot: number; maxHeld?: number } = {
      intervalMs: 250,
      batch: 1000,
      keepHot: 10_000,
    },
  ) {}

  /**
   * Called after each committed batch with the durable mark of every producer in it: the
   * durable acknowledgement (the outbox forgets its rows; runners' connections relay it).
   */
  onDurable(listener: DurableListener): void {
    this.listeners.push(listener);
  }

  /** Marks a tenant as having events to copy. */
  track(tenant: string): void {
    this.dirty.add(tenant);
    const now = Date.now();
    const u = this.uncopied.get(tenant);
    if (u) u.last = now;
    else this.uncopied.set(tenant, { since: now, last: now });
  }

  /**
   * What this process appended and has not copied yet: how many tenants, and the age in
   * milliseconds of the oldest such append (0 when none). An upper bound: an append that
   * arrives while its tenant is being copied counts from that copy's start. Reads memory only.
   */
  pending(now = Date.now()): { tenants: number; oldestMs: number } {
    let oldest = now;
    for (const u of this.uncopied.values()) oldest = Math.min(oldest, u.since);
    return { tenants: this.uncopied.size, oldestMs: now - oldest };
  }

  /** Events this copier has stored in Postgres since it was made. */
  get copied(): number {
    return this.copiedTotal;
  }

  async start(): Promise<void> {
    for (const t of await logEvents.tenantsWithMarks(this.deps.sql)) this.dirty.add(t);
    for (const id of await accounts.allAccountIds(this.deps.sql)) this.dirty.add(id);
    this.timer = setInterval(() => void this.pass(), this.options.intervalMs);
    this.timer.unref();
  }

  /**
   * One pass over the tracked tenants; concurrent calls share the pass under way. (`finally`
   * callbacks always run after this returns, so `running` is set before it is cleared.)
   */
  pass(): Promise<void> {
    if (this.running) return this.running;
    const run = this.copyDirty().finally(() => {
      if (this.running === run) this.running = undefined;
    });
    this.running = run;
    return run;
  }

  private copyDirty(): Promise<void> {
    return workThroughDirty(
      this.dirty,
      (tenant) => this.copyTenant(tenant),
      this.deps.logger,
      'log copy failed; will retry',
    );
  }

  /**
   * Copies everything above the tenant's mark, then trims the hot tail to what is both copied
   * and older than the newest `keepHot` events, and not held by a consumer group (unless the
   * tail would then hold more than `maxHeld`: a group that far behind reads from Postgres).
   * Returns how many events it stored.
   */
  async copyTenant(tenant: string): Promise<number> {
    const started = Date.now();
    let copied = 0;
    let mark = await logEvents.copiedUpTo(this.deps.sql, tenant);
    for (;;) {
      const batch = await this.deps.log.read(tenant, { after: mark, limit: this.options.batch });
      if (batch.length > 0) {
        const marks = await logEvents.storeBatch(this.deps.sql, tenant, batch);
        for (const listener of this.listeners) listener(tenant, marks);
        copied += batch.length;
        this.copiedTotal += batch.length;
        mark = (batch.at(-1) as { id: number }).id;
      }
      if (batch.length < this.options.batch) break;
    }
    // Appends tracked before this copy began are in Postgres now; a later one may not be.
    const u = this.uncopied.get(tenant);
    if (u && u.last < started) this.uncopied.delete(tenant);
    else if (u) u.since = started;
    if (copied > 0) {
      const hold = await this.deps.holds?.(tenant);
      await this.deps.log.trim(tenant, { upTo: mark, keep: this.options.keepHot, hold, maxHeld: this.options.maxHeld });
    }
    return copied;
  }

  /**
   * Copy lag, the health figure: how long ago the oldest event not yet copied was appended,
   * in milliseconds; null when everything is copied. One read of one event.
   */
  async lag(tenant: string): Promise<number | null> {
    const mark = await logEvents.copiedUpTo(this.deps.sql, tenant);
    const [oldest] = await this.deps.log.read(tenant, { after: mark, limit: 1 });
    return oldest ? Math.max(0, Date.now() - Date.parse(oldest.ts)) : null;
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await this.running;
    await this.pass();
  }
}
