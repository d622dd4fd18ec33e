import { type ChildProcess, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { cpuSecondsOf, stopChild, until } from '../lib/proc.ts';
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

/**
 * Source addresses are never reused within one bench process: the sockets of a closed fleet
 * linger in TIME_WAIT on theirs, and binding next to thousands of those makes the kernel's
 * search for a free port slow.
 */
let nextAddress = 0;
function freshAddress(): string {
  const a = nextAddress++;
  return `127.0.${1 + Math.floor(a / 250)}.${2 + (a % 250)}`;
}

/** Sockets per client process: under the 20,000 open files a process may hold here. */
const PER_PROCESS = 5000;

/**
 * SSE watchers held by child processes (watcher.ts), `PER_PROCESS` at most each, each process
 * on its own loopback source address (127.0.1.2, 127.0.1.3, ...) so no address runs out of
 * ephemeral ports however many watchers there are.
 */
export function startFleet(opts: {
  port: number;
  ready: string;
  watchers: WatcherSpec[];
  perProcess?: number;
  inFlight?: number;
}): Fleet {
  const per = Math.min(opts.perProcess ?? PER_PROCESS, 19_000);
  const n = Math.max(1, Math.ceil(opts.watchers.length / per));
  const children: ChildProcess[] = [];
  const statuses: WatcherStatus[] = [];
  const cpu: number[] = [];
  const reports: ((r: WatcherReport) => void)[] = [];
  for (let i = 0; i < n; i++) {
    const child = fork(fileURLToPath(new URL('./watcher.ts', import.meta.url)), [], {
      execArgv: ['--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    statuses.push({ type: 'status', opened: 0, held: 0, failed: 0, closed: 0, received: 0 });
    cpu.push(0);
    child.on('message', (m: WatcherStatus | WatcherReport) => {
      if (m.type === 'status') statuses[i] = m;
      else reports[i]?.(m);
    });
    const job: ToWatcher = {
      type: 'open',
      port: opts.port,
      localAddress: freshAddress(),
      ready: opts.ready,
      watchers: opts.watchers.slice(i * per, (i + 1) * per),
      inFlight: opts.inFlight ?? 64,
    };
    child.send(job);
    children.push(child);
  }
  const sampleCpu = () =>
    children.forEach((c, i) => {
      try {
        cpu[i] = cpuSecondsOf(c.pid as number);
      } catch {
        // gone: keep its last reading
      }
    });
  const sampler = setInterval(sampleCpu, 1000);
  sampler.unref();
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
    processes: n,
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
      sampleCpu();
      const got = await Promise.all(
        children.map(
          (c, i) =>
            new Promise<WatcherReport>((resolve) => {
              reports[i] = resolve;
              c.send({ type: 'report' } satisfies ToWatcher);
            }),
        ),
      );
      sampleCpu();
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
    cpuSeconds: () => cpu.reduce((a, b) => a + b, 0),
    async close() {
      clearInterval(sampler);
      sampleCpu();
      for (const c of children) if (c.connected) c.send({ type: 'close' } satisfies ToWatcher);
      await Promise.all(children.map((c) => stopChild(c, 3000)));
    },
  };
}
