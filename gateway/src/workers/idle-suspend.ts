import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import { suspendIdleSandboxes } from '../services/suspend.ts';
import type { OutboxRelay } from './outbox-relay.ts';
import { PeriodicWorker } from './periodic.ts';

/**
 * Suspends idle sandboxes whose machine this node runs (`suspendIdleSandboxes`): their
 * runner-agent stops, their disk stays, the next prompt wakes them. Runs every quarter of
 * `idleMs`, at least every 250 ms and at most every minute, so a sandbox is suspended within
 * `idleMs` plus a quarter of it (or a minute) after its last turn. It claims only the machines
 * this node holds, each by a compare-and-set on the sandbox's status, and never runs two passes
 * at once. With `idleMs` 0 it never starts.
 */
export class IdleSuspendWorker extends PeriodicWorker {
  constructor(
    private readonly deps: { sql: Sql; providers: SandboxProviders; relay: OutboxRelay; logger: Logger },
    private readonly options: { idleMs: number },
  ) {
    super(deps.logger, 'suspending idle sandboxes');
  }

  start(): void {
    if (this.options.idleMs <= 0) return;
    this.every(Math.min(60_000, Math.max(250, this.options.idleMs / 4)));
  }

  /** Suspends the idle sandboxes of this node; resolves to how many. */
  protected work(): Promise<number> {
    return suspendIdleSandboxes(this.deps, this.options.idleMs);
  }
}
