import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import { recordSilentRunnersGone } from '../services/runners.ts';
import { PeriodicWorker } from './periodic.ts';

/**
 * Records runners gone whose drop nobody closed (`recordSilentRunnersGone`): a runner recorded
 * connected that no heartbeat reached for `timeoutMs`, as when its machine died silently
 * while the node holding its connection died too, or never noticed. Runs every `timeoutMs / 2`
 * (at least every 250 ms), so such a runner is recorded gone, and its owner told with a `team`
 * event, between one and one and a half timeouts after it was last heard from. It claims
 * nothing: each change is compare-and-set on the epoch the pass saw, so any number of nodes may
 * run it at once (and beside the node that closes the connection itself) and the event is
 * written once. With `timeoutMs` 0 it never starts.
 */
export class RunnerPresenceWorker extends PeriodicWorker {
  constructor(
    private readonly deps: { sql: Sql; logger: Logger },
    private readonly options: { timeoutMs: number },
  ) {
    super(deps.logger, 'recording silent runners gone');
  }

  start(): void {
    if (this.options.timeoutMs <= 0) return;
    this.every(Math.max(250, Math.floor(this.options.timeoutMs / 2)));
  }

  /** Records the silent runners gone; resolves to how many. */
  protected work(): Promise<number> {
    return recordSilentRunnersGone(this.deps.sql, this.options.timeoutMs);
  }
}
