import { type ChildProcess, fork } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import type { Config } from '../config.ts';
import type { MetricsSnapshot } from '../metrics.ts';

/**
 * What the primary says to a child, and what a child says (over the fork's IPC channel).
 * Metrics: the primary asks a child for its snapshot (`metrics`, answered by `metrics` with
 * the same id); a child scraped asks the primary for everyone's (`gather-metrics`, answered
 * by `metrics-all`).
 */
export type ToChild =
  | { type: 'start'; config: Config; index: number }
  | { type: 'metrics'; id: number }
  | { type: 'metrics-all'; id: number; snapshots: MetricsSnapshot[] };
export type FromChild =
  | { type: 'ready'; port: number }
  | { type: 'failed'; message: string }
  | { type: 'metrics'; id: number; snapshot: MetricsSnapshot }
  | { type: 'gather-metrics'; id: number };

/** How long a scrape waits for another process's metrics before answering without them. */
export const METRICS_GATHER_TIMEOUT_MS = 2000;

export interface EdgeProcesses {
  /** Process ids of the children listening now (not the primary); a slot restarting is absent. */
  pids(): number[];
  /** Stops every child: SIGTERM, then SIGKILL after `graceMs`. Resolves when all have exited. */
  stop(graceMs: number): Promise<void>;
  /**
   * The metrics of every process: the primary's first, then each listening child's that
   * answers within METRICS_GATHER_TIMEOUT_MS (a child restarting or stuck is left out).
   */
  gatherMetrics(): Promise<MetricsSnapshot[]>;
}

export interface EdgeProcessesOptions {
  /** The configuration every child runs: the primary's, with its bound PORT and EDGE_PROCESSES=1. */
  config: Config;
  count: number;
  log: Logger;
  /** The primary's own metrics, which `gatherMetrics` puts first. */
  ownMetrics: () => Promise<MetricsSnapshot>;
  /** First restart delay; it doubles per consecutive crash up to `maxBackoffMs`. */
  backoffMs?: number;
  maxBackoffMs?: number;
}

/**
 * A free port on `host` for PORT=0 with several processes: uWebSockets.js sets SO_REUSEPORT
 * only when given a port (a socket bound to port 0 cannot be joined; checked on Linux), so the
 * primary binds a port it chose. Another program could take it before the edge listens; the
 * start then fails naming the port.
 */
export function freePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, host, () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

/** The build of child.ts, where this process runs from a bundle (gateway/bundle.mjs defines it). */
declare const SVC_EDGE_CHILD: string | undefined;
const childBundle = typeof SVC_EDGE_CHILD === 'string' ? SVC_EDGE_CHILD : undefined;
const childEntry = childBundle ?? fileURLToPath(new URL('./child.ts', import.meta.url));

/**
 * The node flags a child runs with: the parent's, minus loaders (a child of the source
 * registers tsx itself, once; a bundle's needs none) and inspectors (a second debugger on the
 * same port would fail).
 */
function childExecArgv(parent: readonly string[]): string[] {
  const out = childBundle ? [] : ['--import', import.meta.resolve('tsx')];
  for (let i = 0; i < parent.length; i++) {
    const arg = parent[i] as string;
    if (/^(--import|--loader|--experimental-loader|--require|-r)$/.test(arg)) i++;
    else if (/^--(import|loader|experimental-loader|require|inspect)/.test(arg)) continue;
    else out.push(arg);
  }
  return out;
}

/**
 * Runs `count` more copies of the service beside this one, each a full node (api role, edge,
 * workers) listening on the same port: uWebSockets.js binds with SO_REUSEPORT, so the kernel
 * spreads new connections over every process. They share state only through Postgres and
 * Redis, as separate nodes do.
 *
 * Resolves when every child is listening; rejects (after stopping the others) when one fails
 * its first start. Afterwards a child that exits is logged and started again, after a delay
 * that doubles per consecutive crash (reset once a child has run for a minute). A child exits
 * by itself when this process dies (its IPC channel closes).
 */
export async function startEdgeProcesses(options: EdgeProcessesOptions): Promise<EdgeProcesses> {
  const { config, count, log } = options;
  const backoffMs = options.backoffMs ?? 100;
  const maxBackoffMs = options.maxBackoffMs ?? 10_000;
  const slots: (ChildProcess | undefined)[] = Array.from({ length: count }, () => undefined);
  const listening = new Set<ChildProcess>();
  const timers = new Set<NodeJS.Timeout>();
  let stopping = false;
  // Until every child has started once, a child that dies fails the start instead.
  let supervising = false;
  let nextMetricsId = 0;
  const metricsWaiting = new Map<number, (snapshot: MetricsSnapshot | undefined) => void>();

  /** A child's snapshot, or undefined when it does not answer in time. */
  const childMetrics = (child: ChildProcess): Promise<MetricsSnapshot | undefined> =>
    new Promise((resolve) => {
      const id = ++nextMetricsId;
      const settle = (snapshot: MetricsSnapshot | undefined) => {
        clearTimeout(timer);
        metricsWaiting.delete(id);
        resolve(snapshot);
      };
      const timer = setTimeout(() => settle(undefined), METRICS_GATHER_TIMEOUT_MS);
      metricsWaiting.set(id, settle);
      child.send({ type: 'metrics', id } satisfies ToChild, (err) => {
        if (err) settle(undefined);
      });
    });

  const gatherMetrics = async (): Promise<MetricsSnapshot[]> => {
    const children = await Promise.all([...listening].map(childMetrics));
    return [await options.ownMetrics(), ...children.filter((s) => s !== undefined)];
  };

  /** Forks the child of one slot; resolves when it listens, rejects when it exits before. */
  const launch = (index: number, attempt: number): Promise<void> => {
    const child = fork(childEntry, [], {
      execArgv: childExecArgv(process.execArgv),
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    slots[index] = child;
    const startedAt = Date.now();
    const ready = new Promise<void>((resolve, reject) => {
      let failure = 'exited before it was listening';
      let ended = false;
      const end = (code: number | null, signal: NodeJS.Signals | null) => {
        if (ended) return;
        ended = true;
        reject(new Error(`edge process ${index + 1} (pid ${child.pid}): ${failure}`));
        const wasListening = listening.delete(child);
        if (slots[index] === child) slots[index] = undefined;
        if (stopping || !(supervising || wasListening)) return;
        const next = Date.now() - startedAt > 60_000 ? 0 : attempt + 1;
        const delay = Math.min(maxBackoffMs, backoffMs * 2 ** Math.max(0, next - 1));
        log.warn({ pid: child.pid, code, signal, restartInMs: delay }, 'edge process exited; restarting it');
        const timer = setTimeout(() => {
          timers.delete(timer);
          if (stopping) return;
          launch(index, next).then(
            () => log.info({ pid: slots[index]?.pid }, 'edge process restarted'),
            () => {}, // its end has scheduled the next attempt
          );
        }, delay);
        timers.add(timer);
      };
      child.on('message', (m: FromChild) => {
        if (m.type === 'ready') {
          listening.add(child);
          resolve();
        } else if (m.type === 'failed') failure = m.message;
        else if (m.type === 'metrics') metricsWaiting.get(m.id)?.(m.snapshot);
        else if (m.type === 'gather-metrics') {
          void gatherMetrics().then(
            (snapshots) => child.send({ type: 'metrics-all', id: m.id, snapshots } satisfies ToChild, () => {}),
            () => {},
          );
        }
      });
      child.once('exit', end);
      // A fork that could not spawn never exits; a message to a child that just died is lost
      // (its exit is on the way). Neither may crash this process.
      child.on('error', (err) => {
        log.warn({ err: { message: err.message }, pid: child.pid }, 'edge process error');
        if (child.pid === undefined) {
          failure = err.message;
          end(null, null);
        }
      });
    });
    child.send({ type: 'start', config, index: index + 1 } satisfies ToChild);
    return ready;
  };

  const processes: EdgeProcesses = {
    gatherMetrics,
    pids: () => slots.flatMap((c) => (c?.pid !== undefined && listening.has(c) ? [c.pid] : [])),
    async stop(graceMs: number) {
      stopping = true;
      for (const timer of timers) clearTimeout(timer);
      timers.clear();
      await Promise.all(
        slots.map(async (child) => {
          if (!child || child.exitCode !== null || child.signalCode !== null) return;
          const exited = new Promise((resolve) => child.once('exit', resolve));
          child.kill('SIGTERM');
          const kill = setTimeout(() => child.kill('SIGKILL'), graceMs);
          await exited;
          clearTimeout(kill);
        }),
      );
    },
  };

  try {
    // A first start that fails is a configuration or environment problem: no retry, report it.
    await Promise.all(slots.map((_, index) => launch(index, 0)));
  } catch (err) {
    await processes.stop(1000);
    throw err;
  }
  supervising = true;
  log.info({ pids: processes.pids() }, `${count + 1} edge processes share port ${config.PORT}`);
  return processes;
}
