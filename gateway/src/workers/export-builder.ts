import { exports as exportRows } from '@svc/db';
import { buildExport, type ExportBuildDeps } from '../services/exports.ts';
import { PeriodicWorker } from './periodic.ts';

/**
 * Account exports: every `periodMs` it claims pending exports one at a time and builds each
 * (`buildExport`) until none is left. A claim is a lease of `leaseMs`, taken with `FOR UPDATE
 * SKIP LOCKED` and extended at every page of events written, so any number of workers share
 * the exports and none builds one another holds; a worker killed mid-build leaves only a part
 * file (never a downloadable one) and its lease to expire, and the next worker builds the
 * export again from the start. With `periodMs` 0 it never starts (a test drives `pass()`).
 */
export class ExportBuilder extends PeriodicWorker {
  constructor(
    private readonly deps: ExportBuildDeps,
    private readonly options: { periodMs: number; leaseMs: number },
  ) {
    super(deps.logger, 'building exports');
  }

  start(): void {
    this.every(this.options.periodMs);
  }

  /** Builds every export it can claim; resolves to how many it finished. */
  protected async work(): Promise<number> {
    let built = 0;
    for (;;) {
      const now = this.deps.now();
      const row = await exportRows.claimPending(this.deps.sql, now, new Date(now.getTime() + this.options.leaseMs));
      if (!row) return built;
      // A build that did not finish waits for the next pass rather than being retried at once.
      if ((await buildExport(this.deps, row, this.options.leaseMs)) !== 'ready') return built;
      built++;
    }
  }
}
