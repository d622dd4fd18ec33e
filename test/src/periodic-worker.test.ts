/**
 * PeriodicWorker.workArrived: the in-process wake a worker gets when this process writes work
 * for it (webhook delivery jobs), with the interval as the fallback.
 */
import { createLogger } from '@svc/gateway';
import t from 'tap';
import { PeriodicWorker } from '../../gateway/src/workers/periodic.ts';

/** A worker whose passes are counted and each held open until the test lets it finish. */
class Held extends PeriodicWorker {
  passes = 0;
  private finish: (() => void) | undefined;
  constructor(private readonly periodMs: number) {
    super(createLogger('silent'), 'held worker failed');
  }
  start(): void {
    this.every(this.periodMs);
  }
  protected async work(): Promise<number> {
    this.passes++;
    await new Promise<void>((resolve) => {
      this.finish = resolve;
    });
    return 1;
  }
  /** Lets the pass under way finish; resolves once it has (and any pass it started has begun). */
  async release(): Promise<void> {
    const running = this.pass();
    this.finish?.();
    await running;
  }
}

t.test('work arriving starts a pass at once, without waiting for the interval', async (t) => {
  const w = new Held(3_600_000);
  w.start();
  t.teardown(() => w.stop());
  t.equal(w.passes, 0, 'an hour-long interval has not ticked');
  w.workArrived();
  t.equal(w.passes, 1, 'the pass began');
  await w.release();
  t.equal(w.passes, 1, 'and nothing more came of it');
});

t.test('work arriving during a pass makes exactly one more pass after it', async (t) => {
  const w = new Held(3_600_000);
  w.start();
  t.teardown(() => w.stop());
  w.workArrived();
  w.workArrived();
  w.workArrived();
  t.equal(w.passes, 1, 'one pass at a time');
  await w.release();
  t.equal(w.passes, 2, 'the pass under way may have looked too early: one more follows');
  await w.release();
  t.equal(w.passes, 2, 'three calls meanwhile made one pass, not three');
});

t.test('a worker not on its interval ignores arriving work', async (t) => {
  const off = new Held(0);
  off.start();
  off.workArrived();
  t.equal(off.passes, 0, 'period 0: only an explicit pass runs it');
  const stopped = new Held(3_600_000);
  stopped.start();
  stopped.stop();
  stopped.workArrived();
  t.equal(stopped.passes, 0, 'stopped: nothing more');
  const midway = new Held(3_600_000);
  midway.start();
  midway.workArrived();
  midway.workArrived();
  midway.stop();
  await midway.release();
  t.equal(midway.passes, 1, 'stopped during a pass: the pass asked for after it does not run');
});
