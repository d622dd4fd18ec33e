import type { Logger } from 'pino';

/**
 * A worker that runs passes on an interval: never two at once (a pass asked for while one runs
 * shares it), and never rejecting (a failed pass is logged as `what` and counts 0).
 */
export abstract class PeriodicWorker {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<number> | undefined;
  /** Work arrived while a pass ran: one more pass follows it. */
  private again = false;

  constructor(
    private readonly logger: Logger,
    private readonly what: string,
  ) {}

  /** One pass of the work; resolves to how much it did. */
  protected abstract work(): Promise<number>;

  /** Runs a pass every `periodMs`; 0 or less never starts. The timer keeps no process alive. */
  protected every(periodMs: number): void {
    if (periodMs <= 0) return;
    this.timer = setInterval(() => void this.pass(), periodMs);
    this.timer.unref();
  }

  /** One pass (or the one already running); resolves to how much it did. Never rejects. */
  pass(): Promise<number> {
    this.running ??= this.work()
      .catch((err: Error) => {
        this.logger.warn({ err: { message: err.message } }, this.what);
        return 0;
      })
      .finally(() => {
        this.running = undefined;
        if (this.again && this.timer) void this.pass();
        this.again = false;
      });
    return this.running;
  }

  /**
   * Asks a worker running on its interval for a pass now, because work just came (the timer
   * stays as the fallback, for work written by other processes). A pass under way may have
   * looked before that work was written, so a call during a pass runs one more after it; any
   * number of calls meanwhile make one. A worker not on its interval (period 0: a test drives
   * it with `pass`, or stopped) ignores this.
   */
  workArrived(): void {
    if (!this.timer) return;
    if (this.running) this.again = true;
    else void this.pass();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
