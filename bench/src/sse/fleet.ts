import { forkLoadClients } from '../lib/children.ts';
import { until } from '../lib/proc.ts';
import { Histogram } from '../lib/stats.ts';
import type { ToWatcher, WatcherReport, WatcherSpec, WatcherStatus } from './watcher.ts';

export type { WatcherSpec };

/** What every load client process of a fleet saw, merged. */
export interface FleetReport {
  held: number;
  failed: number;
  closed: number;
  received: number;
  /** Healthy watchers' send-to-receipt latency, one histogram per second of the measurement. */
  perSecond: Histogram[];
  /** All of them together. */
  latency: Histogram;
  slowOpen: number;
  slowClosed: number;
  failures: string[];
}

export interface Fleet {
  processes: number;
  /** The client processes' pids (to pin them to the load clients' cores). */
  pids: number[];
  status(): { opened: number; held: number; failed: number; closed: number; received: number };
  /** Waits until every watcher is held or has failed (or `timeoutMs`), showing progress. */
  opened(timeoutMs: number, onProgress?: (s: ReturnType<Fleet['status']>) => void): Promise<boolean>;
  /** Latencies count from this wall-clock time (ms since the epoch) on. */
  measure(from: number): void;
  report(): Promise<FleetReport>;
  /** CPU seconds the client processes used so far (their last reading once they are gone). */
  cpuSeconds(): number;
  close(): Promise<void>;
}

/** Sockets per client process: under the 20,000 open files a process may hold here. */
const PER_PROCESS = 5000;

/**
 * SSE watchers held by child processes (watcher.ts, forked by lib/children.ts), `PER_PROCESS`
 * at most each, each process on its own fresh loopback source address so no address runs out
 * of ephemeral ports however many watchers there are.
 */
export function startFleet(opts: {
  port: number;
  ready: string;
  watchers: WatcherSpec[];
  perProcess?: number;
  inFlight?: number;
}): Fleet {
  const per = Math.min(opts.perProcess ?? PER_PROCESS, 19_000);
  const loadClients = forkLoadClients(new URL('./watcher.ts', import.meta.url), opts.watchers.length, {
    perProcess: per,
    perAddress: per,
  });
  const children = loadClients.clients.map((c) => c.child);
  const statuses: WatcherStatus[] = [];
  const reports: ((r: WatcherReport) => void)[] = [];
  for (const [i, { child, first, count, localAddress }] of loadClients.clients.entries()) {
    statuses.push({ type: 'status', opened: 0, held: 0, failed: 0, closed: 0, received: 0 });
    child.on('message', (m: WatcherStatus | WatcherReport) => {
      if (m.type === 'status') statuses[i] = m;
      else reports[i]?.(m);
    });
    const job: ToWatcher = {
      type: 'open',
      port: opts.port,
      localAddress,
      ready: opts.ready,
      watchers: opts.watchers.slice(first, first + count),
      inFlight: opts.inFlight ?? 64,
    };
    child.send(job);
  }
  const status = () => {
    const s = { opened: 0, held: 0, failed: 0, closed: 0, received: 0 };
    for (const x of statuses) {
      s.opened += x.opened;
      s.held += x.held;
      s.failed += x.failed;
      s.closed += x.closed;
      s.received += x.received;
    }
    return s;
  };
  return {
    processes: children.length,
    pids: children.map((c) => c.pid as number),
    status,
    async opened(timeoutMs, onProgress) {
      return await until(
        () => {
          const s = status();
          onProgress?.(s);
          return s.held + s.failed >= opts.watchers.length;
        },
        timeoutMs,
        250,
      );
    },
    measure(from) {
      for (const c of children) c.send({ type: 'measure', from } satisfies ToWatcher);
    },
    async report() {
      const got = await Promise.all(
        children.map(
          (c, i) =>
            new Promise<WatcherReport>((resolve) => {
              reports[i] = resolve;
              c.send({ type: 'report' } satisfies ToWatcher);
            }),
        ),
      );
      const perSecond: Histogram[] = [];
      const latency = new Histogram();
      const out: FleetReport = {
        held: 0,
        failed: 0,
        closed: 0,
        received: 0,
        perSecond,
        latency,
        slowOpen: 0,
        slowClosed: 0,
        failures: [],
      };
      for (const r of got) {
        out.held += r.held;
        out.failed += r.failed;
        out.closed += r.closed;
        out.received += r.received;
        out.slowOpen += r.slowOpen;
        out.slowClosed += r.slowClosed;
        out.failures.push(...r.failures);
        r.perSecond.forEach((sparse, s) => {
          const counts = new Float64Array(Histogram.BUCKETS);
          for (const [b, c] of sparse ?? []) counts[b] = c;
          perSecond[s] ??= new Histogram();
          perSecond[s]?.merge(counts);
          latency.merge(counts);
        });
      }
      for (let s = 0; s < perSecond.length; s++) perSecond[s] ??= new Histogram();
      out.failures = out.failures.slice(0, 10);
      return out;
    },
    cpuSeconds: () => loadClients.cpuSeconds(),
    close: () => loadClients.close({ type: 'close' } satisfies ToWatcher),
  };
}
