import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { consumerMarks, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { ConsumerGroups } from '../log/consumer.ts';
import type { EventLog, LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { PeriodicWorker } from './periodic.ts';

/**
 * Where stage events go: resolves once they are safely handed on (delivery jobs written).
 * Called at least once per event, so it must be idempotent per event id; a rejection leaves
 * the events unacknowledged, to be handed out again after `minIdleMs`.
 */
export type StageSink = (accountId: string, events: LogEvent[]) => Promise<void>;

export interface WebhookConsumerOptions {
  /** This consumer's name in the groups: unique per process (a dead one's entries are claimed). */
  name: string;
  /** Events read per step. */
  batch: number;
  /** How long an entry stays with a consumer that does not acknowledge it before another claims it. */
  minIdleMs: number;
  /** The safety-net sweep: the tenant list, claims of idle entries, a drain of every tenant. 0: none. */
  sweepMs: number;
}

export const defaultConsumerName = () => `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;

/** The webhook-worthy events: stage events (stdout, stderr and every other kind never are). */
const isStage = (e: LogEvent) => e.kind === 'stage';

interface Watched {
  unsubscribe: () => void;
  /** The mark this node last recorded for the tenant (a sweep writes only a moved one). */
  recorded: number | undefined;
  draining: Promise<void> | undefined;
  again: boolean;
}

/**
 * Reads each listed tenant's log through a consumer group and hands its stage events, in id
 * order per batch, to the sink; acknowledges a batch only once the sink resolved, so every
 * stage event reaches the sink at least once whatever process dies when. Woken by the tenant's
 * live feed (one subscription per tenant on this node), not by polling each tenant; a slow
 * sweep refreshes the tenant list, claims what dead consumers left, records in Postgres how
 * far each group got, and drains every tenant in case a wake was lost.
 *
 * A group behind the hot log's trim point is caught up from the durable copy. A group lost
 * with the hot log (Redis lost its data, the embedded defaults restarted) is made again after
 * a catch-up from the recorded mark, so nothing copied is skipped. A tenant that leaves the
 * list has its group and mark removed.
 */
export class WebhookConsumer extends PeriodicWorker {
  private readonly watched = new Map<string, Watched>();
  private stopped = false;

  constructor(
    private readonly deps: {
      sql: Sql;
      log: EventLog;
      groups: ConsumerGroups;
      sink: StageSink;
      /** The tenants to consume (those with webhook endpoints). */
      tenants: () => Promise<string[]>;
      /**
       * Since when (epoch ms) the tenant has had endpoints, asked when its group is first
       * made: the group then starts at the first event appended from then on (ids are at
       * least the append's clock in microseconds), so an event appended between the first
       * endpoint's creation and this consumer's noticing it is not missed. Without an answer
       * it starts at the log's last id.
       */
      since?: (tenant: string) => Promise<number | undefined>;
      logger: Logger;
    },
    private readonly options: WebhookConsumerOptions,
  ) {
    super(deps.logger, 'webhook consumer sweep failed; will retry');
  }

  /** The first sweep (tenants watched, groups created), then one every `sweepMs`. */
  async start(): Promise<void> {
    await this.pass();
    if (!this.stopped) this.every(this.options.sweepMs);
  }

  /**
   * Stops waking and sweeping at once (what it holds unacknowledged is left to other consumers,
   * as a death would); resolves when the work under way is done.
   */
  override async stop(): Promise<void> {
    this.stopped = true;
    super.stop();
    const draining = [...this.watched.values()].map((w) => {
      w.unsubscribe();
      return w.draining;
    });
    this.watched.clear();
    await Promise.all(draining);
  }

  protected async work(): Promise<number> {
    const listed = await this.deps.tenants();
    if (this.stopped) return 0;
    const wanted = new Set(listed);
    // Tenants that left the list, here or while no consumer ran (their groups would otherwise
    // hold the hot log's trim for good).
    const left = new Set(await consumerMarks.consumedTenants(this.deps.sql));
    for (const tenant of this.watched.keys()) left.add(tenant);
    for (const tenant of left) {
      if (wanted.has(tenant)) continue;
      this.watched.get(tenant)?.unsubscribe();
      this.watched.delete(tenant);
      await this.deps.groups.drop(tenant);
      await consumerMarks.forgetConsumed(this.deps.sql, tenant);
    }
    for (const tenant of listed) if (!this.watched.has(tenant)) await this.watch(tenant);
    for (const [tenant, w] of [...this.watched]) {
      await this.claim(tenant);
      await this.wake(tenant);
      const hold = await this.deps.groups.holdFrom(tenant);
      if (hold !== undefined && hold - 1 !== w.recorded) {
        await consumerMarks.recordConsumed(this.deps.sql, tenant, hold - 1);
        w.recorded = hold - 1;
      }
    }
    return this.watched.size;
  }

  /** Subscribes before the first drain (which makes the group): an append after it always wakes. */
  private async watch(tenant: string): Promise<void> {
    const w: Watched = { unsubscribe: () => {}, recorded: undefined, draining: undefined, again: false };
    this.watched.set(tenant, w);
    w.unsubscribe = await this.deps.log.subscribe(tenant, () => void this.wake(tenant));
    if (this.stopped) w.unsubscribe();
  }

  private async startAfter(tenant: string): Promise<number> {
    const last = await this.deps.log.lastId(tenant);
    const since = await this.deps.since?.(tenant);
    return since === undefined ? last : Math.max(0, Math.min(last, since * 1000 - 1));
  }

  /**
   * Drains the tenant: one drain at a time per tenant on this node, and a wake during a drain
   * makes it go round once more. Resolves when the tenant has nothing more to read. Never rejects.
   */
  wake(tenant: string): Promise<void> {
    const w = this.watched.get(tenant);
    if (!w) return Promise.resolve();
    if (w.draining) {
      w.again = true;
      return w.draining;
    }
    const run = (async () => {
      do {
        w.again = false;
        await this.drain(tenant);
      } while (w.again && !this.stopped);
    })()
      .catch((err: Error) =>
        this.deps.logger.warn({ err: { message: err.message }, tenant }, 'webhook consumer: drain failed; will retry'),
      )
      .finally(() => {
        w.draining = undefined;
      });
    w.draining = run;
    return run;
  }

  private async drain(tenant: string): Promise<void> {
    const { groups } = this.deps;
    let made = false;
    while (!this.stopped) {
      const r = await groups.read(tenant, this.options.name, this.options.batch);
      if (r.status === 'missing') {
        if (made) return;
        made = true;
        await this.makeGroup(tenant);
        continue;
      }
      if (r.status === 'behind') {
        await this.catchUp(tenant, r.after, r.below);
        continue;
      }
      await this.deliver(tenant, r.events);
      if (r.events.length < this.options.batch) return;
    }
  }

  /**
   * A tenant never consumed starts where `startAfter` says, and that is recorded. One whose
   * group is gone although it was consumed before (the hot log lost it) resumes after its
   * recorded mark: what lies between is read from the durable copy and the hot log, sunk, and
   * the group made after the last event read. (Another node doing the same at once is harmless:
   * the sink is idempotent, and the first group made stays.)
   */
  private async makeGroup(tenant: string): Promise<void> {
    const { sql, groups } = this.deps;
    let after = await consumerMarks.consumedUpTo(sql, tenant);
    if (after === undefined) {
      const start = await this.startAfter(tenant);
      await groups.create(tenant, start);
      await consumerMarks.recordConsumed(sql, tenant, start);
      return;
    }
    for (;;) {
      const page = await readLog({ sql, log: this.deps.log }, tenant, { after, limit: this.options.batch });
      if (page.length === 0) break;
      const stage = page.filter(isStage);
      if (stage.length > 0) await this.deps.sink(tenant, stage);
      after = (page.at(-1) as LogEvent).id;
      await consumerMarks.recordConsumed(sql, tenant, after);
      if (page.length < this.options.batch) break;
    }
    await groups.create(tenant, after);
  }

  /** The sink first, then the acknowledgement: a death in between hands them out again. */
  private async deliver(tenant: string, events: LogEvent[]): Promise<void> {
    if (events.length === 0) return;
    const stage = events.filter(isStage);
    if (stage.length > 0) await this.deps.sink(tenant, stage);
    await this.deps.groups.ack(
      tenant,
      events.map((e) => e.id),
    );
  }

  /**
   * The group's position is below the trim point: the events in between are read from the
   * durable copy (and the hot log above it), sunk, and the position moved past them. A death
   * before the move reads them again.
   */
  private async catchUp(tenant: string, after: number, below: number): Promise<void> {
    const batch = this.options.batch;
    const events = await readLog({ sql: this.deps.sql, log: this.deps.log }, tenant, { after, limit: batch });
    const within = events.filter((e) => e.id < below);
    const stage = within.filter(isStage);
    if (stage.length > 0) await this.deps.sink(tenant, stage);
    const to = within.length === batch ? (within.at(-1) as LogEvent).id : below - 1;
    await this.deps.groups.advance(tenant, after, to);
  }

  /**
   * Takes over what consumers that died (or whose sink failed) left unacknowledged past
   * `minIdleMs`. Entries the hot log no longer holds are read from the durable copy.
   */
  private async claim(tenant: string): Promise<void> {
    const { groups } = this.deps;
    for (;;) {
      const { events, gone } = await groups.claim(
        tenant,
        this.options.name,
        this.options.minIdleMs,
        this.options.batch,
      );
      const found: LogEvent[] = [];
      for (const id of gone) {
        const [e] = await readLog({ sql: this.deps.sql, log: this.deps.log }, tenant, { after: id - 1, limit: 1 });
        if (e?.id === id && isStage(e)) found.push(e);
      }
      if (found.length > 0) await this.deps.sink(tenant, found);
      await this.deliver(tenant, events);
      if (events.length + gone.length < this.options.batch) return;
    }
  }
}
