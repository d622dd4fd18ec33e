import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import { endTurnsAdrift } from '../services/turns.ts';

/**
 * Ends the turns nothing else will end (`endTurnsAdrift`): a turn still `running` whose runner
 * has not been heard from for `graceMs`, as after a restart of the service when the runner did
 * not come back. Runs every `graceMs / 2` (at least every 250 ms), so such a turn ends between
 * one and one and a half grace periods after its runner was last heard from. It claims nothing:
 * every end is compare-and-set on the turn's state, so any number of nodes may run it at once
 * and a turn whose runner comes back in time is left alone.
 */
export class TurnsAdriftWorker {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<number> | undefined;

  constructor(
    private readonly deps: { sql: Sql; providers: SandboxProviders; logger: Logger },
    private readonly options: { graceMs: number },
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.pass(), Math.max(250, Math.floor(this.options.graceMs / 2)));
    this.timer.unref();
  }

  /**
   * One pass, or the one under way (a database slower than the interval would otherwise
   * collect passes in its pool's queue); resolves to how many turns it ended. Never rejects (a
   * failure is logged).
   */
  pass(): Promise<number> {
    this.running ??= endTurnsAdrift(this.deps, this.options.graceMs)
      .catch((err: Error) => {
        this.deps.logger.warn({ err: { message: err.message } }, 'ending turns adrift');
        return 0;
      })
      .finally(() => {
        this.running = undefined;
      });
    return this.running;
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
