import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import { endTurnsAdrift } from '../services/turns.ts';
import { PeriodicWorker } from './periodic.ts';

/**
 * Ends the turns nothing else will end (`endTurnsAdrift`): a turn still `running` whose runner
 * has not been heard from for `graceMs`, as after a restart of the service when the runner did
 * not come back. Runs every `graceMs / 2` (at least every 250 ms), so such a turn ends between
 * one and one and a half grace periods after its runner was last heard from. It claims nothing:
 * every end is compare-and-set on the turn's state, so any number of nodes may run it at once
 * and a turn whose runner comes back in time is left alone.
 */
export class TurnsAdriftWorker extends PeriodicWorker {
  constructor(
    private readonly deps: { sql: Sql; providers: SandboxProviders; logger: Logger },
    private readonly options: { graceMs: number },
  ) {
    super(deps.logger, 'ending turns adrift');
  }

  start(): void {
    this.every(Math.max(250, Math.floor(this.options.graceMs / 2)));
  }

  /** Ends the turns adrift; resolves to how many. */
  protected work(): Promise<number> {
    return endTurnsAdrift(this.deps, this.options.graceMs);
  }
}
