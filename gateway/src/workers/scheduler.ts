import { newId } from '@svc/core';
import { schedules } from '@svc/db';
import type { Logger } from 'pino';
import type { SchedulerMetrics } from '../metrics.ts';
import { nextSlot } from '../services/cron.ts';
import { fireSchedule, type RunDeps } from '../services/schedule-runs.ts';
import { PeriodicWorker } from './periodic.ts';

/** How many due schedules one pass claims at most; the next pass takes the rest. */
const BATCH = 50;

/**
 * The scheduler: every `periodMs` it claims the schedules due by its
 * clock and fires each once. A claim is a lease of `leaseMs` taken with `FOR UPDATE SKIP
 * LOCKED`, so any number of workers share the due rows and none fires a row another holds.
 * The run is stamped, and `next_run_at` moved to the first slot after the clock (unless an
 * edit moved it meanwhile), in one transaction that also releases the claim, and only while
 * the claim still holds: after downtime a schedule that missed several slots fires once, not
 * once per slot. A worker killed mid-fire leaves its lease to expire; the next claimant reuses
 * the claim's conversation id, so the run is neither lost nor launched twice, and a claimant
 * that outlived its lease stamps nothing. A suspended account's schedule launches nothing (the
 * launch refuses it, refuseIfSuspended): the run is stamped with that `last_error` and the
 * schedule moves to its next slot like any run that could not start, so it is not fired again
 * before then. A pass never overlaps the previous one. With `periodMs` 0 it never starts.
 */
export class SchedulerWorker extends PeriodicWorker {
  constructor(
    private readonly deps: RunDeps & { logger: Logger; metrics?: SchedulerMetrics },
    private readonly options: { periodMs: number; leaseMs: number },
  ) {
    super(deps.logger, 'firing due schedules');
  }

  start(): void {
    this.every(this.options.periodMs);
  }

  /** Claims the schedules due by the clock and fires each; resolves to how many it fired. */
  protected async work(): Promise<number> {
    const now = this.deps.now();
    const claimed = await schedules.claimDue(
      this.deps.sql,
      now,
      new Date(now.getTime() + this.options.leaseMs),
      BATCH,
      () => newId('cnv'),
    );
    for (const row of claimed) await this.fire(row, now);
    return claimed.length;
  }

  /**
   * Fires one row this worker claimed at `now` (`schedules.claimDue`) and stamps it under that
   * claim: when the lease ran out and another worker took the row over meanwhile, this one
   * stamps nothing, so a run is recorded once.
   */
  async fire(row: schedules.ScheduleRow, now: Date): Promise<void> {
    let nextRunAt: Date | null = null;
    try {
      nextRunAt = nextSlot(row.cron, now);
    } catch {
      // A stored expression no longer parses: the run is recorded and the schedule stops.
    }
    const who = { accountId: row.account_id, actor: 'system' as const, ip: null };
    const result = await fireSchedule(this.deps, who, row, 'cron', {
      conversationId: row.claim_conversation_id as string,
      nextRunAt,
      lease: row.claimed_until as Date,
      slot: row.next_run_at,
    });
    this.deps.metrics?.scheduleRun(result.error ? 'failed' : 'started');
    if (result.error) {
      this.deps.logger.info({ scheduleId: row.id, error: result.error.code }, 'scheduled run did not start');
    }
  }
}
