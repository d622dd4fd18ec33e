import { supportReports } from '@svc/db';
import type { Logger } from 'pino';
import { type ForwardDeps, forwardReport, type RetryPolicy } from '../services/support-forwarding.ts';
import { PeriodicWorker } from './periodic.ts';

/** How many reports one pass claims at most; the next pass takes the rest. */
const BATCH = 10;

/**
 * Support forwarding: every `periodMs` it claims the reports still `new` whose next attempt is
 * due by its clock, and forwards each to the configured issue host and/or support mailbox
 * (`forwardReport`). A claim is a lease of `leaseMs` taken with `FOR UPDATE SKIP LOCKED`, so
 * any number of workers share the reports and none forwards a report another holds; a worker
 * that dies (or a process that restarts) mid-report leaves its lease to expire, and the report
 * is taken again, its finished destinations not repeated. Each claim counts an attempt: after
 * `maxAttempts` the report ends `failed` with `forward_error`. With no destination configured
 * it claims nothing (the stored reports are the inbox), and with `periodMs` 0 it never starts.
 */
export class SupportForwarder extends PeriodicWorker {
  constructor(
    private readonly deps: ForwardDeps & { logger: Logger; now: () => Date },
    private readonly options: RetryPolicy & { periodMs: number; leaseMs: number },
  ) {
    super(deps.logger, 'forwarding support reports');
  }

  /** Whether any destination is configured (else there is nothing to do). */
  get forwards(): boolean {
    return this.deps.issues !== undefined || this.deps.mail !== undefined;
  }

  start(): void {
    if (this.forwards) this.every(this.options.periodMs);
  }

  /** Claims the due reports and forwards each; resolves to how many it tried. */
  protected async work(): Promise<number> {
    if (!this.forwards) return 0;
    const now = this.deps.now();
    const claimed = await supportReports.claimDue(
      this.deps.sql,
      now,
      new Date(now.getTime() + this.options.leaseMs),
      BATCH,
    );
    for (const report of claimed) {
      const outcome = await forwardReport(this.deps, report, this.options, now);
      if (outcome !== 'forwarded') {
        this.deps.logger.warn(
          { reportId: report.id, attempts: report.attempts, outcome },
          'support report not forwarded',
        );
      }
    }
    return claimed.length;
  }
}
