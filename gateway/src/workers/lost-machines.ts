import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import { endTurnsOfLostMachines } from '../services/turns.ts';

/** How long a machine that outlived the service's last process has to reconnect after a start. */
const RECONNECT_WINDOW_MS = 3_000;

/**
 * Once, `RECONNECT_WINDOW_MS` after the service started: the machines this node ran before it
 * started again (as after a power cut, which takes the local runner-agents along) whose
 * process is gone and that did not reconnect get their running turns ended, as their provider
 * says (`adrift`: `interrupted` for local sandboxes), with the stage events a watcher needs.
 * Without it they would wait for the adrift sweep, a grace period or two. A machine that
 * survived and reconnected keeps its turn. It claims only the machines its providers report
 * (each once), and every end is compare-and-set on the turn's state.
 */
export class LostMachinesWorker {
  private timer: NodeJS.Timeout | undefined;
  private done: Promise<number> | undefined;

  constructor(
    private readonly deps: { sql: Sql; providers: SandboxProviders; logger: Logger },
    private readonly options: { windowMs: number } = { windowMs: RECONNECT_WINDOW_MS },
  ) {}

  start(): void {
    this.timer = setTimeout(() => void this.pass(), this.options.windowMs);
    this.timer.unref();
  }

  /** The one pass (or the one already run); resolves to how many turns it ended. Never rejects. */
  pass(): Promise<number> {
    this.done ??= (async () => {
      let ended = 0;
      for (const provider of this.deps.providers.all) {
        const runnerIds = await provider.lostAtStart();
        if (runnerIds.length === 0) continue;
        this.deps.logger.info({ provider: provider.name, runners: runnerIds }, 'machines lost with the last process');
        ended += await endTurnsOfLostMachines(this.deps, provider, runnerIds);
      }
      return ended;
    })().catch((err: Error) => {
      this.deps.logger.warn({ err: { message: err.message } }, 'ending the turns of machines lost at start');
      return 0;
    });
    return this.done;
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
