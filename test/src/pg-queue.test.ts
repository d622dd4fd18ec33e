// The Postgres driver's connection queue, as patches/postgres+3.4.9.patch leaves it (the root's
// postinstall applies it). Unpatched, a queue that never runs empty (every connection busy under
// sustained load) grows by one spent slot per query and every move of a connection searches all
// of them: the pool slowed down the longer the load lasted.
import { createRequire } from 'node:module';
import fc from 'fast-check';
import t from 'tap';

type Queue<T> = { readonly length: number; push(x: T): T; shift(): T | undefined; remove(x: T): T | null };
type QueueFactory = <T>(initial?: T[]) => Queue<T>;

const esmUrl = new URL('./queue.js', import.meta.resolve('postgres'));
const cjsPath = createRequire(import.meta.url)
  .resolve('postgres')
  .replace(/index\.js$/, 'queue.js');
const builds: Array<[string, () => Promise<QueueFactory>]> = [
  ['src (ESM)', async () => (await import(esmUrl.href)).default],
  ['cjs', async () => createRequire(import.meta.url)(cjsPath)],
];

// Counts the elements every indexOf call may search (the array's length less the start index).
function searched<R>(fn: () => R): { result: R; widest: number } {
  const indexOf = Array.prototype.indexOf;
  let widest = 0;
  Array.prototype.indexOf = function (this: unknown[], x: unknown, from?: number) {
    widest = Math.max(widest, this.length - (from ?? 0));
    return indexOf.call(this, x, from);
  } as typeof indexOf;
  try {
    return { result: fn(), widest };
  } finally {
    Array.prototype.indexOf = indexOf;
  }
}

for (const [name, load] of builds) {
  t.test(`${name}: a queue that never runs empty keeps its searches short`, async (t) => {
    const Queue = await load();
    const connections = Array.from({ length: 10 }, (_, id) => ({ id }));
    const busy = Queue(connections);
    // The pool's sequence for a query handed to a busy connection: shift it off the busy queue,
    // then move it back (remove from its recorded queue, which finds nothing, and push).
    const { result: order, widest } = searched(() => {
      const order: number[] = [];
      for (let i = 0; i < 100_000; i++) {
        const c = busy.shift() as { id: number };
        busy.remove(c);
        busy.push(c);
        if (i >= 99_990) order.push(c.id);
      }
      return order;
    });
    t.equal(busy.length, 10, 'still ten connections');
    t.same(order, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 'first in, first out throughout');
    t.ok(widest <= 2048 + 10, `the widest search covered ${widest} slots (the unpatched queue: 100,000)`);
  });

  t.test(`${name}: push, shift and remove behave as a plain FIFO list`, async (t) => {
    const Queue = await load();
    const op = fc.oneof(
      fc.record({ kind: fc.constant('push' as const), n: fc.integer({ min: 1, max: 50 }) }),
      fc.record({ kind: fc.constant('shift' as const), n: fc.integer({ min: 1, max: 3000 }) }),
      fc.record({ kind: fc.constant('remove' as const), n: fc.integer({ min: 0, max: 5000 }) }),
    );
    const check = () =>
      fc.assert(
        fc.property(fc.array(op, { maxLength: 200 }), (ops) => {
          const q = Queue<number>();
          const model: number[] = [];
          let next = 0;
          for (const { kind, n } of ops) {
            if (kind === 'push') {
              for (let i = 0; i < n * 40; i++) {
                q.push(next);
                model.push(next++);
              }
            } else if (kind === 'shift') {
              for (let i = 0; i < n && model.length > 0; i++) {
                if (q.shift() !== model.shift()) return false;
              }
            } else {
              const at = model.indexOf(n);
              const removed = q.remove(n);
              if (at === -1 ? removed !== null : removed !== n) return false;
              if (at !== -1) model.splice(at, 1);
            }
            if (q.length !== model.length) return false;
          }
          const rest: number[] = [];
          while (q.length > 0) rest.push(q.shift() as number);
          return rest.join() === model.join();
        }),
        { numRuns: 300 },
      );
    t.doesNotThrow(check, 'the same answers as an array in 300 random sequences');
  });
}
