import { egressLog, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import { PeriodicWorker } from './periodic.ts';

/** How often each node sweeps: retention is counted in hours, so a few minutes late is nothing. */
const SWEEP_EVERY_MS = 10 * 60_000;

/**
 * Deletes the egress log of conversations that ended more than `retentionHours` ago
 * (BROKER_LOG_RETENTION_HOURS), every ten minutes. Every node runs one; passes on several
 * nodes at once only delete the same rows once (a delete is idempotent), and one node never
 * runs two passes at once.
 */
export class EgressLogSweeper extends PeriodicWorker {
  constructor(
    private readonly deps: { sql: Sql; logger: Logger },
    private readonly options: { retentionHours: number; periodMs?: number },
  ) {
    super(deps.logger, 'sweeping the egress log');
  }

  start(): void {
    this.every(this.options.periodMs ?? SWEEP_EVERY_MS);
  }

  /** Resolves to how many rows went. */
  protected work(): Promise<number> {
    return egressLog.sweepEgressLog(this.deps.sql, this.options.retentionHours);
  }
}
