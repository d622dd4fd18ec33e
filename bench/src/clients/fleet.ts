/**
 * The parent side of runner-fleet.ts: spreads sockets over child processes and loopback source
 * addresses (lib/children.ts), opens them, starts and stops the traffic, and sums what the
 * children say.
 */
import type { ChildProcess } from 'node:child_process';
import { forkLoadClients } from '../lib/children.ts';
import { Histogram } from '../lib/stats.ts';
import type { FleetDone, FleetRunner, FleetStart, FleetTick } from './runner-fleet.ts';

/** Sockets per child process (under the 20,000 open files a process may have here). */
export const PER_CHILD = 4000;
/** Sockets per loopback source address (well under the ~28,000 ephemeral ports). */
const PER_ADDRESS = 15_000;

export interface Fleet {
  children: ChildProcess[];
  /** Sockets open (welcomed, for runners) across the children, as last reported. */
  open(): number;
  /** Starts traffic; `onTick` gets the fleet's sum once a second. */
  go(rate: number | undefined, onTick: (t: FleetTick) => void): void;
  /** Stops traffic and returns the totals (the children stay, sockets open, until `close`). */
  stop(): Promise<{
    acked: number;
    frames: number;
    acks: number;
    histogram: Histogram;
    open: number;
    closes: Record<string, number>;
    errors: number;
    retries: number;
    errorSamples: string[];
  }>;
  /** CPU seconds the children used so far. */
  cpuSeconds(): number;
  close(): Promise<void>;
}

type Spec =
  | {
      kind: 'runner';
      url: string;
      runners: FleetRunner[];
      stream?: { batch: number; payloadBytes: number; window: number };
    }
  | { kind: 'echo'; url: string; count: number };

export async function startFleet(
  spec: Spec,
  opts: { children?: number; concurrency?: number; onProgress?: (open: number) => void } = {},
): Promise<Fleet> {
  const total = spec.kind === 'runner' ? spec.runners.length : spec.count;
  const loadClients = forkLoadClients(new URL('./runner-fleet.ts', import.meta.url), total, {
    perProcess: PER_CHILD,
    perAddress: PER_ADDRESS,
    processes: opts.children,
  });
  const children = loadClients.clients.map((c) => c.child);
  const n = children.length;
  const opens = children.map(() => 0);
  const ticks: (FleetTick | undefined)[] = [];
  const readies: Promise<void>[] = [];
  let tickHandler: ((t: FleetTick) => void) | undefined;
  for (const [i, { child, first, count, localAddress }] of loadClients.clients.entries()) {
    readies.push(
      new Promise<void>((resolve, reject) => {
        child.on('message', (m: { type: string; open?: number }) => {
          if (m.type === 'connected' || m.type === 'ready') {
            opens[i] = m.open ?? 0;
            opts.onProgress?.(opens.reduce((a, b) => a + b, 0));
            if (m.type === 'ready') resolve();
          } else if (m.type === 'tick') {
            ticks[i] = m as unknown as FleetTick;
            opens[i] = m.open ?? 0;
            // Once every child has reported this second, hand on the sum.
            if (ticks.filter(Boolean).length === n) {
              const all = ticks as FleetTick[];
              const weight = all.reduce((a, t) => a + t.count, 0);
              tickHandler?.({
                type: 'tick',
                acked: all.reduce((a, t) => a + t.acked, 0),
                frames: all.reduce((a, t) => a + t.frames, 0),
                count: weight,
                // Children's percentiles, weighted by their sample counts (p99 as the worst).
                p50: weight ? all.reduce((a, t) => a + (t.count ? t.p50 * t.count : 0), 0) / weight : Number.NaN,
                p99: Math.max(...all.map((t) => (t.count ? t.p99 : Number.NEGATIVE_INFINITY))),
                open: opens.reduce((a, b) => a + b, 0),
              });
              ticks.fill(undefined);
            }
          }
        });
        child.once('exit', (code) => reject(new Error(`a load client exited (${code}) before it was ready`)));
      }),
    );
    const start: FleetStart =
      spec.kind === 'runner'
        ? {
            type: 'start',
            kind: 'runner',
            url: spec.url,
            runners: spec.runners.slice(first, first + count),
            localAddress,
            concurrency: opts.concurrency ?? 50,
            stream: spec.stream,
          }
        : { type: 'start', kind: 'echo', url: spec.url, count, localAddress, concurrency: opts.concurrency ?? 50 };
    child.send(start);
  }
  const closeAll = () => loadClients.close({ type: 'exit' });
  try {
    await Promise.all(readies);
  } catch (err) {
    await closeAll();
    throw err;
  }
  const rate = (r: number | undefined) => (r === undefined ? undefined : r / n);
  return {
    children,
    open: () => opens.reduce((a, b) => a + b, 0),
    go(r, onTick) {
      tickHandler = onTick;
      for (const c of children) c.send({ type: 'go', rate: rate(r) });
    },
    async stop() {
      const dones = await Promise.all(
        children.map(
          (c) =>
            new Promise<FleetDone>((resolve) => {
              const on = (m: { type: string }) => {
                if (m.type !== 'done') return;
                c.off('message', on);
                resolve(m as FleetDone);
              };
              c.on('message', on);
              c.send({ type: 'stop' });
            }),
        ),
      );
      const histogram = new Histogram();
      const closes: Record<string, number> = {};
      for (const d of dones) {
        histogram.merge(d.histogram);
        for (const [k, v] of Object.entries(d.closes)) closes[k] = (closes[k] ?? 0) + v;
      }
      return {
        acked: dones.reduce((a, d) => a + d.acked, 0),
        frames: dones.reduce((a, d) => a + d.frames, 0),
        acks: dones.reduce((a, d) => a + d.acks, 0),
        histogram,
        open: dones.reduce((a, d) => a + d.open, 0),
        closes,
        errors: dones.reduce((a, d) => a + d.errors, 0),
        retries: dones.reduce((a, d) => a + d.retries, 0),
        errorSamples: dones.flatMap((d) => d.errorSamples).slice(0, 5),
      };
    },
    cpuSeconds: () => loadClients.cpuSeconds(),
    close: closeAll,
  };
}
