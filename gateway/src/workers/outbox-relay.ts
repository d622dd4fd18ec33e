import { logEvents, outbox, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { AppendEvents } from '../log/log.append.ts';
import { workThroughDirty } from './dirty-tenants.ts';

/**
 * Appends the outbox to the log (DESIGN.md "Producers and durability"): each tenant's rows in
 * order, as the producer `outbox` numbering them by their outbox number, so a row relayed
 * twice (by this node after a restart, or by two nodes at once) is appended once. Rows stay in
 * the outbox until the Postgres copy holds them durably: if Redis loses what was appended,
 * they are still here to be relayed again.
 *
 * Woken by the Postgres notification the outbox sends on commit (when `listen` is set), by
 * `flush`/`kick` from this process, and by
 * a sweep every `intervalMs` that also finds rows a crashed node left.
 */
export class OutboxRelay {
  /** Per tenant: the highest outbox number the log acknowledged to this node. */
  private readonly relayed = new Map<string, number>();
  private readonly dirty = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private sweeping: Promise<void> | undefined;
  private again = false;
  private unlisten: (() => Promise<void>) | undefined;

  constructor(
    private readonly deps: { sql: Sql; appendEvents: AppendEvents; logger: Logger; listen: boolean },
    private readonly options: { intervalMs: number; batch: number } = { intervalMs: 250, batch: 500 },
  ) {}

  async start(): Promise<void> {
    if (this.deps.listen) {
      try {
        const listening = await this.deps.sql.listen(outbox.OUTBOX_CHANNEL, (tenant) => this.kick(tenant));
        this.unlisten = () => listening.unlisten();
      } catch (err) {
        // Other nodes' changes then wait for the sweep: slower, not lost.
        this.deps.logger.warn(
          { err: { message: (err as Error).message } },
          `outbox: LISTEN failed; relaying every ${this.options.intervalMs} ms`,
        );
      }
    }
    this.timer = setInterval(() => void this.sweep(), this.options.intervalMs);
    this.timer.unref();
    await this.sweep();
  }

  /** A tenant's outbox has new rows: relay them soon. */
  kick(tenant: string): void {
    this.dirty.add(tenant);
    void this.pass();
  }

  /** Relays the tenant's outbox now and resolves once what was committed before is in the log. */
  async flush(tenant: string): Promise<void> {
    this.dirty.add(tenant);
    await this.pass();
    // A pass that was already running when the rows committed may have missed them.
    if (this.dirty.has(tenant)) await this.pass();
  }

  /** The copy holds the tenant's outbox durably up to `seq`: those rows may go. */
  async durable(tenant: string, seq: number): Promise<void> {
    await outbox.forget(this.deps.sql, tenant, seq);
  }

  /**
   * Finds every tenant with rows, then relays. One at a time: on a database slower than the
   * interval, each tick would otherwise add a query to its pool's queue, and the queue would
   * outlive the service (the driver reconnects to run what was queued, even once ended).
   */
  private sweep(): Promise<void> {
    this.sweeping ??= (async () => {
      try {
        for (const tenant of await outbox.tenantsWithRows(this.deps.sql)) this.dirty.add(tenant);
      } catch (err) {
        this.deps.logger.error({ err: { message: (err as Error).message } }, 'outbox sweep failed');
        return;
      }
      await this.pass();
    })().finally(() => {
      this.sweeping = undefined;
    });
    return this.sweeping;
  }

  /** Relays every dirty tenant; a kick during a pass runs another pass after it. */
  pass(): Promise<void> {
    if (this.running) {
      this.again = true;
      return this.running;
    }
    const run = (async () => {
      do {
        this.again = false;
        await workThroughDirty(
          this.dirty,
          (tenant) => this.relayTenant(tenant),
          this.deps.logger,
          'outbox relay failed; will retry',
        );
      } while (this.again && this.dirty.size > 0);
    })().finally(() => {
      if (this.running === run) this.running = undefined;
    });
    this.running = run;
    return run;
  }

  private async relayTenant(tenant: string): Promise<void> {
    const { sql, appendEvents } = this.deps;
    // What the copy already holds durably is forgotten first (another node may have copied it).
    const durable = await logEvents.durableMark(sql, tenant, outbox.OUTBOX_PRODUCER);
    if (durable !== undefined) await outbox.forget(sql, tenant, durable);
    let after = Math.max(this.relayed.get(tenant) ?? 0, durable ?? 0);
    for (;;) {
      const rows = await outbox.rowsAfter(sql, tenant, after, this.options.batch);
      // One append carries one conversation's events: consecutive rows of one conversation go together.
      let i = 0;
      while (i < rows.length) {
        let j = i + 1;
        while (j < rows.length && rows[j]?.conversationId === rows[i]?.conversationId) j++;
        const group = rows.slice(i, j);
        const first = group[0] as outbox.OutboxRow;
        const result = await appendEvents({ tenant, producer: outbox.OUTBOX_PRODUCER, seq: first.seq, events: group });
        if (result.status === 'gap') {
          // The log is behind what the outbox still holds: never expected (rows are forgotten
          // only once durable, and the log loads a lost mark from the copy). Say so loudly.
          throw new Error(`outbox relay: the log's mark ${result.hwm} is below outbox row ${first.seq}`);
        }
        after = (group.at(-1) as outbox.OutboxRow).seq;
        this.relayed.set(tenant, after);
        i = j;
      }
      if (rows.length < this.options.batch) return;
    }
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await this.unlisten?.().catch(() => {});
    await this.sweeping;
    await this.running;
  }
}
