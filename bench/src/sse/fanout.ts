import { fork } from 'node:child_process';
import { benchModule } from '../lib/child-module.ts';
import { type CoreSplit, pinTree } from '../lib/cores.ts';
import { startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import {
  type CpuTimes,
  cpuOfTree,
  cpuSecondsOf,
  cpuTimesOfTree,
  rssOfTree,
  sleep,
  stopChild,
  until,
} from '../lib/proc.ts';
import type { Progress } from '../lib/progress.ts';
import { startRedis } from '../lib/redis.ts';
import type { Context } from '../lib/scenario.ts';
import { Histogram, median, round } from '../lib/stats.ts';
import type { Layout } from '../ops/fanout.ts';
import type { GcSummary } from '../ops/gc.ts';
import { startNchan } from '../peers/nchan.ts';
import { startUwsFloor } from '../peers/uws-sse.ts';
import { type FleetReport, startFleet, type WatcherSpec } from './fleet.ts';
import type { PublishJob } from './publisher.ts';

export type System = 'ours' | 'Nchan' | 'floor';

export interface FanoutPlan {
  /**
   * What each watcher follows: one conversation (`/api/conversations/:id/stream`; a channel
   * per conversation on the peers), or everything of its tenant (`/api/events/stream`; a
   * channel per tenant on the peers). Default: conversation.
   */
  stream?: 'conversation' | 'tenant';
  /** Healthy watchers, spread evenly over the conversations (or the tenants). */
  watchers: number;
  conversations: number;
  tenants: number;
  /** Events a second, in total, round robin over the conversations. */
  rate: number;
  seconds: number;
  /** Bytes of filler after each event's send time. */
  padding: number;
  /** More watchers of the same conversations that stop reading once held. */
  slow: number;
  /** Our service's configuration on top of the bench defaults. */
  config?: Record<string, string>;
  /** An existing Redis for ours (--redis, or one a scenario shares between runs). */
  redis?: string;
  /**
   * Ours on its in-memory event log, with no Redis at all (the embedded default's log, with
   * Postgres copying it as with Redis): what the Redis round trip of every append costs.
   */
  memoryLog?: boolean;
  /** An existing Postgres for ours (one a scenario shares between runs). */
  postgres?: string;
  /** Node flags for our service (`--cpu-prof`). */
  nodeArgs?: string[];
  /**
   * Seconds of the same publishing before the measurement, not counted, on every system alike:
   * the steady state is measured, not a process's first seconds (JIT, first allocations).
   */
  warmupSeconds?: number;
  /**
   * Where processes run: the server side (the server, and ours' Redis and Postgres or a peer's
   * publisher) on `cores.servers`, the watcher processes on `cores.clients`. Absent: unpinned.
   */
  cores?: CoreSplit;
}

/**
 * CPU seconds each process of a system's side used over the measured window (publishing and
 * draining): ours' service process tree, and the Redis and Postgres it runs on when this run
 * started them; a peer's server (nginx master and workers, or the floor) and its publisher.
 */
export interface SideCpu {
  /** Component name to CPU seconds, e.g. {server: 2.1, Redis: 0.4, Postgres: 0.2}. */
  parts: Record<string, number>;
  /** Of each part, the kernel's share (stime): its system calls, the socket writes among them. */
  kernel: Record<string, number>;
  total: number;
  /** What could not be counted (a Redis given by --redis, say). */
  missing: string[];
}

export interface FanoutResult {
  system: System;
  held: number;
  failed: number;
  published: number;
  publishFailed: number;
  expected: number;
  delivered: number;
  /** Deliveries to healthy watchers over the nominal publishing time. */
  deliveredPerSecond: number;
  latency: Record<string, number>;
  /**
   * Healthy watchers' p99 in each of P99_WINDOWS equal parts of the publishing time, and their
   * median: one moment of other work on the shared machine moves one window, not the figure.
   */
  p99Windows: number[];
  p99Median: number;
  /** Healthy watchers' latency percentiles per second of the run. */
  perSecond: { second: number; count: number; p50: number; p99: number }[];
  rssBefore: number;
  rssAfter: number;
  rssPeak: number;
  serverCpuSeconds: number;
  /** The whole side's CPU over the measured window (the server's included). */
  sideCpu: SideCpu;
  /** sideCpu.total per thousand deliveries. */
  cpuSecondsPerThousand: number;
  clientCpuSeconds: number;
  /** The watcher processes alone over the run. */
  watcherCpuSeconds: number;
  /** Ours: the collector's pauses of the event loop over the measured window. */
  gc?: GcSummary;
  /**
   * Ours, whose appends run inside the service: how late each was issued against its schedule
   * (the event loop's lag, as a publisher process would see its socket read late) and how
   * long the append took, percentiles in ms.
   */
  appends?: { issueLagMs: Record<string, number>; appendMs: Record<string, number> };
  slowHeld: number;
  slowClosed: number;
  failures: string[];
}

const now = () => performance.timeOrigin + performance.now();

/** Parts of the publishing time whose p99 are taken apart (FanoutResult.p99Windows). */
export const P99_WINDOWS = 3;

/** The p99 of each of `n` equal parts of `seconds`; what arrives after them counts in the last. */
export function windowP99s(perSecond: Histogram[], seconds: number, n: number): number[] {
  const count = Math.max(1, Math.min(n, seconds));
  const windows = Array.from({ length: count }, () => new Histogram());
  perSecond.forEach((h, s) => {
    windows[Math.min(count - 1, Math.floor((s * count) / seconds))]?.merge(h.counts);
  });
  return windows.map((h) => round(h.percentile(99), 3));
}

const perTenant = (plan: FanoutPlan) => Math.ceil(plan.conversations / plan.tenants);
/** The tenant of conversation `c` (conversations are laid out tenant by tenant). */
const tenantOf = (plan: FanoutPlan, c: number) => Math.floor(c / perTenant(plan));
/** How many of `total` go to part `k` of `parts` when dealt round robin. */
const share = (total: number, parts: number, k: number) => Math.floor(total / parts) + (k < total % parts ? 1 : 0);

/**
 * What watcher `i` follows: conversation `i % conversations`, or tenant `i % tenants`, so each
 * gets the same share. Slow watchers follow conversations spread evenly over all of them (or
 * their tenants).
 */
function targetOf(plan: FanoutPlan, i: number, slow: boolean): number {
  const c = slow ? Math.floor((i * plan.conversations) / Math.max(1, plan.slow)) % plan.conversations : i;
  return plan.stream === 'tenant' ? (slow ? tenantOf(plan, c) : c % plan.tenants) : c % plan.conversations;
}

/** Healthy deliveries due: each event once per healthy watcher of its conversation (or tenant). */
function expectedDeliveries(plan: FanoutPlan, published: number): number {
  let sum = 0;
  for (let c = 0; c < plan.conversations; c++) {
    const events = share(published, plan.conversations, c);
    const watchers =
      plan.stream === 'tenant'
        ? share(plan.watchers, plan.tenants, tenantOf(plan, c))
        : share(plan.watchers, plan.conversations, c);
    sum += events * watchers;
  }
  return sum;
}

/**
 * One fan-out run against one system: start it, hold the watchers, publish at the plan's
 * rate, wait for delivery to finish (or 10 s past the end), read memory and CPU, stop it.
 */
export async function runFanout(system: System, plan: FanoutPlan, progress: Progress): Promise<FanoutResult> {
  const stops: (() => Promise<unknown>)[] = [];
  // Every process whose CPU counts on this system's side, by component.
  const side: { name: string; pid: number }[] = [];
  const missing: string[] = [];
  const serverCores = plan.cores?.pinned ? plan.cores.servers : '';
  const clientCores = plan.cores?.pinned ? plan.cores.clients : '';
  try {
    let port: number;
    let pid: number;
    let ready: string;
    let specs: WatcherSpec[];
    let publish: (
      seconds: number,
    ) => Promise<{ sent: number; failed: number; cpu: number; appends?: FanoutResult['appends'] }>;
    // BENCH_CPU_PROF=<dir>: a CPU profile of our service over the measured window.
    let profile: { start(): Promise<unknown>; stop(): Promise<string> } | undefined;
    let gcPauses: { start(): Promise<unknown>; stop(): Promise<GcSummary> } | undefined;
    if (system === 'ours') {
      let redisUrl = plan.redis;
      // No Redis at all: the service keeps its log in memory (REDIS_URL empty is unset).
      if (plan.memoryLog) redisUrl = '';
      else if (!redisUrl) {
        const redis = await startRedis();
        stops.push(() => redis.stop());
        redisUrl = redis.url;
        side.push({ name: 'Redis', pid: redis.pid });
      } else missing.push('Redis (not started by this run)');
      // Postgres outside the service's process tree, as deployed: the embedded server would
      // share these cores with the service that delivers the events.
      let postgresUrl = plan.postgres;
      if (!postgresUrl) {
        const pg = await startPostgres();
        stops.push(() => pg.stop());
        postgresUrl = pg.url;
        side.push({ name: 'Postgres', pid: pg.pid });
      } else missing.push('Postgres (not started by this run)');
      const ours = await startOurs(
        {
          SSE_HEARTBEAT_MS: '15000',
          SSE_IDLE_CLOSE_MS: '0',
          REDIS_URL: redisUrl,
          DATABASE_URL: postgresUrl,
          REDIS_KEY_PREFIX: `bench${Date.now()}:`,
          ...plan.config,
        },
        plan.nodeArgs,
      );
      stops.push(() => ours.stop());
      side.unshift({ name: 'server', pid: ours.pid });
      gcPauses = { start: () => ours.call('ops/gc#start'), stop: () => ours.call<GcSummary>('ops/gc#stop') };
      const dir = process.env.BENCH_CPU_PROF;
      if (dir) {
        profile = {
          start: () => ours.call('ops/profile#start'),
          stop: () => ours.call<string>('ops/profile#stop', { dir, name: `fanout-${plan.slow ? 'slow' : 'ours'}` }),
        };
      }
      progress.update(`ours: ${plan.tenants} accounts, ${plan.conversations} conversations`);
      const layout = await ours.call<Layout>('ops/fanout#setup', { tenants: plan.tenants, perTenant: perTenant(plan) });
      const conversations = layout.tenants.flatMap((t) => t.conversations.map((id) => ({ id, key: t.key })));
      conversations.length = plan.conversations;
      const spec = (i: number, slow: boolean): WatcherSpec => {
        const target = targetOf(plan, i, slow);
        if (plan.stream === 'tenant') {
          const key = (layout.tenants[target] as { key: string }).key;
          return { path: '/api/events/stream', authorization: `Bearer ${key}`, slow };
        }
        const c = conversations[target] as { id: string; key: string };
        return { path: `/api/conversations/${c.id}/stream?wait=true`, authorization: `Bearer ${c.key}`, slow };
      };
      // Slow watchers are more watchers of the same conversations, spread over all of them.
      specs = [
        ...Array.from({ length: plan.watchers }, (_, i) => spec(i, false)),
        ...Array.from({ length: plan.slow }, (_, i) => spec(i, true)),
      ];
      ({ port, pid } = ours);
      ready = ': connected';
      publish = async (seconds) => {
        const r = await ours.call<{
          appended: number;
          failed: number;
          issueLag: Record<string, number>;
          appendMs: Record<string, number>;
        }>('ops/fanout#append', {
          rate: plan.rate,
          seconds,
          padding: plan.padding,
          conversations: plan.conversations,
        });
        return {
          sent: r.appended,
          failed: r.failed,
          cpu: 0,
          appends: { issueLagMs: r.issueLag, appendMs: r.appendMs },
        };
      };
    } else {
      const peer =
        system === 'Nchan'
          ? await startNchan({ connections: plan.watchers + plan.slow + 100 }, (s) => progress.say(s))
          : await startUwsFloor();
      stops.push(() => peer.stop());
      ({ port, pid } = peer);
      ready = system === 'Nchan' ? ': hi' : ': connected';
      // A channel per conversation, or per tenant: published to round robin over the
      // conversations, as ours appends.
      const channel = (target: number) => (plan.stream === 'tenant' ? `t${target}` : `c${target}`);
      const channels = Array.from({ length: plan.conversations }, (_, c) =>
        channel(plan.stream === 'tenant' ? tenantOf(plan, c) : c),
      );
      specs = [
        ...Array.from({ length: plan.watchers }, (_, i) => ({ path: `/sub/${channel(targetOf(plan, i, false))}` })),
        ...Array.from({ length: plan.slow }, (_, i) => ({
          path: `/sub/${channel(targetOf(plan, i, true))}`,
          slow: true,
        })),
      ];
      side.unshift({ name: 'server', pid });
      // One publisher process for the warm-up and the measurement, started before either, so
      // its start (loading its code) is not in the measured window.
      const publisherModule = benchModule(new URL('./publisher.ts', import.meta.url));
      const publisher = fork(publisherModule.script, [], {
        execArgv: publisherModule.execArgv,
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      });
      stops.push(() => stopChild(publisher));
      await new Promise<void>((resolve, reject) => {
        publisher.once('message', () => resolve());
        publisher.once('exit', (code) => reject(new Error(`publisher exited (${code})`)));
      });
      side.push({ name: 'publisher', pid: publisher.pid as number });
      publish = async (seconds) => {
        const before = cpuSecondsOf(publisher.pid as number);
        const done = await new Promise<{ sent: number; failed: number }>((resolve, reject) => {
          const onExit = (code: number | null) => reject(new Error(`publisher exited (${code})`));
          publisher.once('exit', onExit);
          publisher.once('message', (m: { sent: number; failed: number }) => {
            publisher.off('exit', onExit);
            resolve(m);
          });
          publisher.send({
            type: 'publish',
            port,
            channels,
            rate: plan.rate,
            seconds,
            padding: plan.padding,
            connections: 16,
          } satisfies PublishJob);
        });
        return { ...done, cpu: cpuSecondsOf(publisher.pid as number) - before };
      };
    }
    for (const { pid: p } of side) pinTree(p, serverCores);

    const fleet = startFleet({ port, ready, watchers: specs, inFlight: 32 });
    stops.push(() => fleet.close());
    for (const p of fleet.pids) pinTree(p, clientCores);
    await fleet.opened(240_000, (s) =>
      progress.update(`${system}: ${s.held}/${specs.length} watchers held, ${s.failed} failed`),
    );
    const opened = fleet.status();
    progress.say(`${system}: ${opened.held}/${specs.length} watchers held (${fleet.processes} client processes)`);
    // A moment for the openings' work to finish (a smoke run's few seconds have little to wait for).
    await sleep(Math.min(1000, plan.seconds * 200));
    if (plan.warmupSeconds) {
      progress.update(`${system}: warming up, ${plan.warmupSeconds} s of the same publishing, not counted`);
      await publish(plan.warmupSeconds);
      await sleep(1000);
    }
    const rssBefore = rssOfTree(pid);
    let rssPeak = rssBefore;
    const memory = setInterval(() => {
      rssPeak = Math.max(rssPeak, rssOfTree(pid));
    }, 250);
    await profile?.start();
    await gcPauses?.start();
    const cpuBefore = cpuOfTree(pid);
    const sideBefore = side.map(({ pid: p }) => cpuTimesOfTree(p));
    const start = now();
    fleet.measure(start);
    const publishing = publish(plan.seconds);
    await progress.countdown(plan.seconds, () => `${system}: ${fleet.status().received} delivered`);
    const published = await publishing;
    const expected = expectedDeliveries(plan, published.sent);
    await until(
      () => {
        progress.update(`${system}: draining, ${fleet.status().received}/${expected} delivered`);
        return fleet.status().received >= expected;
      },
      10_000,
      100,
    );
    await sleep(300);
    clearInterval(memory);
    const rssAfter = rssOfTree(pid);
    rssPeak = Math.max(rssPeak, rssAfter);
    const serverCpuSeconds = cpuOfTree(pid) - cpuBefore;
    const parts: Record<string, number> = {};
    const kernel: Record<string, number> = {};
    side.forEach(({ name, pid: p }, i) => {
      const after = cpuTimesOfTree(p);
      const before = sideBefore[i] as CpuTimes;
      parts[name] = round(after.total - before.total, 3);
      kernel[name] = round(after.kernel - before.kernel, 3);
    });
    const sideTotal = Object.values(parts).reduce((a, b) => a + b, 0);
    const gc = await gcPauses?.stop();
    if (profile) progress.say(`ours: CPU profile ${await profile.stop()}`);
    const report: FleetReport = await fleet.report();
    const p99Windows = windowP99s(report.perSecond, plan.seconds, P99_WINDOWS);
    const result: FanoutResult = {
      system,
      held: report.held - report.slowOpen - report.slowClosed,
      failed: report.failed,
      published: published.sent,
      publishFailed: published.failed,
      expected,
      delivered: report.received,
      deliveredPerSecond: round(report.received / plan.seconds),
      latency: report.latency.summary(),
      p99Windows,
      // A part with no delivery at all has no p99 (NaN): a smoke run's two 1 s parts on a busy
      // machine, where every event of the first arrived in the second. The median is of the
      // parts that have one; the whole-run p99 and the delivered count still show such a stall.
      p99Median: median(p99Windows.filter(Number.isFinite)),
      perSecond: report.perSecond.map((h: Histogram, second) => ({
        second,
        count: h.total,
        p50: round(h.percentile(50), 3),
        p99: round(h.percentile(99), 3),
      })),
      rssBefore,
      rssAfter,
      rssPeak,
      serverCpuSeconds: round(serverCpuSeconds),
      sideCpu: { parts, kernel, total: round(sideTotal, 3), missing },
      cpuSecondsPerThousand: report.received > 0 ? round((sideTotal * 1000) / report.received, 5) : Number.NaN,
      // The watcher processes, and a peer's publisher over the measured window (which also
      // counts on the peer's side, in sideCpu).
      clientCpuSeconds: round(fleet.cpuSeconds() + published.cpu),
      watcherCpuSeconds: round(fleet.cpuSeconds()),
      gc,
      appends: published.appends,
      slowHeld: report.slowOpen + report.slowClosed,
      slowClosed: report.slowClosed,
      failures: report.failures,
    };
    progress.say(
      `${system}: ${result.delivered}/${expected} delivered (${Math.round(result.deliveredPerSecond)}/s), p50 ${result.latency.p50} ms, p99 ${result.latency.p99} ms (per part ${result.p99Windows.join(', ')}), p99.9 ${result.latency['p99.9']} ms, side CPU ${result.sideCpu.total} s (${Object.entries(
        parts,
      )
        .map(([k, v]) => `${k} ${v} (kernel ${kernel[k]})`)
        .join(
          ', ',
        )}), ${result.cpuSecondsPerThousand} s per 1k deliveries, RSS ${mib(rssBefore)} -> peak ${mib(rssPeak)} MiB${gc ? `, GC ${gc.pauses} pauses, ${gc.totalMs} ms, longest ${gc.maxMs} ms` : ''}${plan.slow ? `, slow watchers cut ${result.slowClosed}/${result.slowHeld}` : ''}`,
    );
    return result;
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => {});
  }
}

export const mib = (b: number) => (b / 2 ** 20).toFixed(1);

/**
 * One Redis (`--redis`, or a throwaway one) and one throwaway Postgres for every run of ours
 * in a scenario (each run has its own accounts and key prefix), stopped when it ends.
 */
export async function sharedStores({ opts, progress, defer }: Context): Promise<{ redis: string; postgres: string }> {
  const pg = await startPostgres((s) => progress.say(s));
  defer(() => pg.stop());
  let redis = opts.redis;
  if (!redis) {
    const r = await startRedis();
    defer(() => r.stop());
    redis = r.url;
  }
  return { redis, postgres: pg.url };
}
