import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { sandboxProducer } from '@svc/core';
import { APPEND, logKeys } from '../../../gateway/src/log/log.redis.ts';
import { storedFields } from '../../../gateway/src/log/log.ts';
import { startFleet } from '../clients/fleet.ts';
import { ensurePackages } from '../lib/apt.ts';
import { startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import { cpuOfTree, cpuSecondsOf, rssOf, sleep, stopChild } from '../lib/proc.ts';
import { startRedis } from '../lib/redis.ts';
import { type Outcome, ratioTarget, type Scenario } from '../lib/scenario.ts';
import { median, round } from '../lib/stats.ts';

/** Bytes of each stdout chunk a runner sends (a line of build output). */
const PAYLOAD_BYTES = 200;
/** Events per output frame. */
const BATCH = 20;
/** Frames a runner keeps unacknowledged. */
const WINDOW = 4;

const cpuOr = (pid: number | undefined) => {
  if (pid === undefined) return Number.NaN;
  try {
    return cpuSecondsOf(pid);
  } catch {
    return Number.NaN;
  }
};

/** redis-benchmark processes running, stopped by the scenario's clean-up if it fails midway. */
const benchmarks = new Set<ChildProcess>();

interface BenchRun {
  clients: number;
  pipeline: number;
  calls: number;
  /** Entries the calls added to the ceiling tenant's log stream (counted in Redis). */
  appendedEvents: number;
  callsPerSecond: number;
  eventsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  clientCpuSeconds: number;
  redisCpuSeconds: number;
  seconds: number;
}

/** Entries ever added to a stream (trimming does not lower it), read with redis-cli. */
function entriesAdded(port: number, key: string): number {
  const args = ['-h', '127.0.0.1', '-p', String(port), 'XINFO', 'STREAM', key];
  const lines = execFileSync('redis-cli', args).toString().split('\n');
  const at = lines.findIndex((l) => l.trim() === 'entries-added');
  // No such stream yet: nothing added.
  return at < 0 ? 0 : Number(lines[at + 1]);
}

/**
 * One redis-benchmark run of `EVALSHA <append script>` with a fresh producer per call (its
 * mark key holds `__rand_int__`), so every call appends its whole batch as the service's
 * first append for a producer does. What it appended is counted in Redis (entries added to the log
 * stream, before and after), so a call that appended nothing (an error reply, a producer
 * number drawn twice) does not count. Its CPU is sampled from /proc while it runs.
 */
async function redisBenchmark(
  port: number,
  redisPid: number | undefined,
  command: string[],
  o: { clients: number; pipeline: number; calls: number; batch: number },
): Promise<BenchRun> {
  const logKey = command[4] as string;
  const before = entriesAdded(port, logKey);
  const args = ['-h', '127.0.0.1', '-p', String(port), '-c', String(o.clients), '-P', String(o.pipeline)];
  args.push('-n', String(o.calls), '-r', '2000000000', '--csv', ...command);
  const redisCpu0 = cpuOr(redisPid);
  const started = performance.now();
  const child = spawn('redis-benchmark', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  benchmarks.add(child);
  child.once('exit', () => benchmarks.delete(child));
  let out = '';
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
  });
  child.stderr.on('data', (d: Buffer) => {
    out += d.toString();
  });
  let cpu = 0;
  const poll = setInterval(() => {
    const c = cpuOr(child.pid);
    if (Number.isFinite(c)) cpu = c;
  }, 100);
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  clearInterval(poll);
  const seconds = (performance.now() - started) / 1000;
  // The CSV row ends with rps, avg, min, p50, p95, p99, max (its first field, the command,
  // holds the payload's newlines, so the row is read from its end).
  const row = /"([\d.]+)","([\d.]+)","([\d.]+)","([\d.]+)","([\d.]+)","([\d.]+)","([\d.]+)"\s*$/.exec(out);
  const fields = row ? row.slice(1).map(Number) : [];
  const rps = Number(fields[0]);
  if (code !== 0 || !Number.isFinite(rps)) throw new Error(`redis-benchmark failed (${code}): ${out.slice(-500)}`);
  const appendedEvents = entriesAdded(port, logKey) - before;
  return {
    clients: o.clients,
    pipeline: o.pipeline,
    calls: o.calls,
    appendedEvents,
    callsPerSecond: rps,
    // Its own call rate, times what a call appended on average.
    eventsPerSecond: (rps * appendedEvents) / o.calls,
    p50Ms: Number(fields[3]),
    p99Ms: Number(fields[5]),
    clientCpuSeconds: cpu,
    redisCpuSeconds: cpuOr(redisPid) - redisCpu0,
    seconds,
  };
}

/**
 * `EVALSHA <the service's append script>` for redis-benchmark, with the keys and stored JSON
 * the service writes for a batch of BATCH stdout events: a tenant of its own, one
 * conversation stream, and a fresh producer per call (`__rand_int__` in its mark key), so
 * every call appends its whole batch.
 */
function ceilingCommand(redisPort: number, conversation: string): string[] {
  const sha = execFileSync('redis-cli', ['-h', '127.0.0.1', '-p', String(redisPort), 'SCRIPT', 'LOAD', APPEND])
    .toString()
    .trim();
  const keys = logKeys('', 'acc_benchceiling');
  const data = `${'x'.repeat(PAYLOAD_BYTES - 1)}\n`;
  const ts = new Date().toISOString();
  const producer = sandboxProducer('sbx___rand_int__', 0);
  const pairs: string[] = [];
  for (let i = 1; i <= BATCH; i++) {
    const e = { conversationId: conversation, kind: 'output', stream: 'stdout', data };
    pairs.push(String(i), JSON.stringify(storedFields(e, ts, producer, i)));
  }
  return [
    'EVALSHA',
    sha,
    '6',
    keys.seq,
    keys.log,
    keys.conversation(conversation),
    keys.producer(producer),
    keys.live,
    keys.trim,
    String(BATCH),
    '0',
    '-',
    '0',
    ...pairs,
  ];
}

/**
 * Runners streaming output into the service's single write path on the Redis adapter: each
 * runner (real protocol from load-client processes: hello, numbered `output` frames of its
 * sandbox, `appended` acknowledgements, which come after the append) keeps WINDOW frames of
 * BATCH stdout chunks of PAYLOAD_BYTES unacknowledged. Measured: acknowledged events/s on
 * one node. Ceiling in the same run, on the same Redis: redis-benchmark running the service's
 * own append script (EVALSHA) with the same batch, payload and key layout.
 */
export const ingest: Scenario = {
  name: 'ingest',
  title: 'ingest: runner output appended to the Redis event log, acknowledged events/s',
  defaults: { connections: 50, duration: 10, rate: 0 },
  smoke: { connections: 50, duration: 2, rate: 0 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const n = opts.connections;
    const warmup = opts.smoke ? 0.5 : 3;
    const figures: Record<string, unknown> = {
      runners: n,
      seconds: opts.duration,
      payloadBytes: PAYLOAD_BYTES,
      eventsPerFrame: BATCH,
      framesInFlightPerRunner: WINDOW,
    };
    ensurePackages(['redis-tools'], (s) => progress.say(s));
    defer(() => Promise.all([...benchmarks].map((c) => stopChild(c))));
    let redisUrl = opts.redis;
    let redisPid: number | undefined;
    if (!redisUrl) {
      progress.update('starting Redis');
      const redis = await startRedis();
      defer(() => redis.stop());
      redisUrl = redis.url;
      redisPid = redis.pid;
    }
    const redisPort = Number(new URL(redisUrl).port || 6379);

    // --- ours
    // BENCH_CPU_PROF=<dir>: a CPU profile of the gateway over the measured window.
    const profDir = process.env.BENCH_CPU_PROF;
    // Storage on a throwaway PostgreSQL, as a deployment on Redis has, outside the service's
    // process tree (the embedded server is the service's child).
    progress.update('starting PostgreSQL');
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const ours = await startOurs({ REDIS_URL: redisUrl, DATABASE_URL: pg.url });
    defer(() => ours.stop());
    progress.update(`making ${n} runners with a sandbox and a conversation each`);
    const made = await ours.call<{
      accountId: string;
      runners: { id: string; token: string; sandbox: string; conversation: string }[];
    }>('ops/runners#makeRunners', { count: n, sandboxes: true });
    const fleet = await startFleet(
      {
        kind: 'runner',
        url: ours.url,
        runners: made.runners,
        stream: { batch: BATCH, payloadBytes: PAYLOAD_BYTES, window: WINDOW },
      },
      { children: opts.smoke ? 1 : 2, onProgress: (open) => progress.update(`runners connected: ${open}/${n}`) },
    );
    defer(() => fleet.close());
    // Three rounds, and the median of each: one round disturbed by other work on the machine
    // moves neither side.
    const rounds = opts.smoke ? 1 : 3;
    const ticks: { at: number; acked: number; p50: number; p99: number; count: number }[] = [];
    const series: { second: number; rate: number; p50: number; p99: number; count: number }[] = [];
    const oursRounds: Record<string, number>[] = [];
    const runs: BenchRun[] = [];
    let benchCpu = 0;
    let clientCpu = 0;
    let done: Awaited<ReturnType<typeof fleet.stop>> | undefined;
    const command = ceilingCommand(redisPort, made.runners[0]?.conversation ?? 'cnv_bench');
    figures.ceilingCommandBytes = command.reduce((a, s) => a + Buffer.byteLength(s), 0);
    // Ours has up to one append per runner in flight on one connection: the same depth as one
    // connection pipelining N, or N connections one each. The better of the two is the ceiling.
    const shapes = [
      { clients: 1, pipeline: n },
      { clients: n, pipeline: 1 },
    ];
    const callsPerSecond = new Map<(typeof shapes)[number], number>();
    // Rounds alternate ours and the ceiling, so the machine's noise (other work on its two
    // cores) falls on both; each figure is the mean of its rounds.
    for (let round_ = 0; round_ < rounds; round_++) {
      const label = rounds > 1 ? `round ${round_ + 1}/${rounds} ` : '';
      // --- ours
      ticks.length = 0;
      fleet.go(undefined, (t) =>
        ticks.push({ at: performance.now(), acked: t.acked, p50: t.p50, p99: t.p99, count: t.count }),
      );
      await progress.countdown(warmup, () => `${label}warm-up: ${ticks.at(-1)?.acked ?? 0} events acknowledged`);
      const first = ticks.length;
      if (profDir && round_ === 0) await ours.call('ops/profile#start');
      const oursCpu0 = cpuOr(ours.pid);
      const redisCpu0 = cpuOr(redisPid);
      const pgCpu0 = cpuOfTree(pg.pid);
      const clientCpu0 = fleet.cpuSeconds();
      const lastRate = () => {
        const [a, b] = ticks.slice(-2);
        return a && b ? Math.round(((b.acked - a.acked) * 1000) / (b.at - a.at)) : 0;
      };
      await progress.countdown(opts.duration, () => `${label}ours: ${lastRate()} events/s acknowledged`);
      // A last tick so the window ends on a reported figure.
      await sleep(1100);
      const oursCpu = cpuOr(ours.pid) - oursCpu0;
      const redisCpuOurs = cpuOr(redisPid) - redisCpu0;
      const pgCpu = cpuOfTree(pg.pid) - pgCpu0;
      if (profDir && round_ === 0) {
        figures.gatewayProfile = await ours.call<string>('ops/profile#stop', { dir: profDir, name: 'ingest' });
      }
      const window = ticks.slice(Math.max(0, first - 1));
      const from = window[0];
      const to = window.at(-1);
      const seconds = from && to ? (to.at - from.at) / 1000 : Number.NaN;
      const rate = from && to && to.at > from.at ? (to.acked - from.acked) / seconds : Number.NaN;
      const offset = series.length;
      for (const [i, t] of window.slice(1).entries()) {
        const prev = window[i] as { acked: number; at: number };
        series.push({
          second: offset + i + 1,
          rate: ((t.acked - prev.acked) * 1000) / (t.at - prev.at),
          p50: t.p50,
          p99: t.p99,
          count: t.count,
        });
      }
      // Pause the runners (what is in flight is still acknowledged) while the ceiling runs.
      done = await fleet.stop();
      clientCpu = fleet.cpuSeconds();
      oursRounds.push({
        eventsPerSecond: round(rate),
        measuredSeconds: round(seconds),
        gatewayCpuSecondsPerSecond: round(oursCpu / seconds, 3),
        redisCpuSecondsPerSecond: round(redisCpuOurs / seconds, 3),
        postgresCpuSecondsPerSecond: round(pgCpu / seconds, 3),
        clientCpuSecondsPerSecond: round((clientCpu - clientCpu0) / seconds, 3),
        gatewayRss: rssOf(ours.pid),
      });
      progress.say(
        `${label}ours: ${round(rate)} events/s acknowledged; gateway CPU ${round(oursCpu / seconds, 2)} s/s, Redis ${round(redisCpuOurs / seconds, 2)} s/s, Postgres ${round(pgCpu / seconds, 2)} s/s`,
      );
      await sleep(1000);

      // --- ceiling: redis-benchmark running the same script, same batch, payload and keys
      try {
        for (const shape of shapes) {
          let cps = callsPerSecond.get(shape);
          if (cps === undefined) {
            progress.update(`redis-benchmark -c ${shape.clients} -P ${shape.pipeline}: calibrating`);
            const probe = await redisBenchmark(redisPort, redisPid, command, { ...shape, calls: 2000, batch: BATCH });
            benchCpu += probe.clientCpuSeconds;
            cps = probe.callsPerSecond;
            callsPerSecond.set(shape, cps);
            if (opts.smoke) {
              runs.push(probe);
              continue;
            }
          }
          const calls = Math.max(2000, Math.round(cps * opts.duration));
          const [r] = await Promise.all([
            redisBenchmark(redisPort, redisPid, command, { ...shape, calls, batch: BATCH }),
            progress.countdown(
              Math.ceil(calls / cps),
              () => `${label}redis-benchmark -c ${shape.clients} -P ${shape.pipeline}`,
            ),
          ]);
          benchCpu += r.clientCpuSeconds;
          runs.push(r);
          progress.say(
            `${label}redis-benchmark -c ${shape.clients} -P ${shape.pipeline}: ${Math.round(r.callsPerSecond)} calls/s = ${Math.round(r.eventsPerSecond)} events/s (Redis CPU ${round(r.redisCpuSeconds / r.seconds, 2)} s/s)`,
          );
        }
      } catch (err) {
        figures.ceilingError = (err as Error).message;
        progress.say(`the ceiling could not be measured: ${(err as Error).message}`);
      }
    }
    await fleet.close();
    const stopping = performance.now();
    await ours.stop();
    figures.gatewayStopSeconds = round((performance.now() - stopping) / 1000);
    const oursRate = median(oursRounds.map((r) => r.eventsPerSecond as number));
    const acks = done?.acks ?? 0;
    figures.ours = {
      eventsPerSecond: round(oursRate),
      // Frames queued behind an append are appended together (RunnerFabric.drain).
      framesPerAppend: acks ? round((done?.frames ?? 0) / acks) : Number.NaN,
      rounds: oursRounds,
      eventsAcknowledged: done?.acked,
      framesSent: done?.frames,
      frameToAckMs: done?.histogram.summary(),
      closes: done?.closes,
      clientErrors: done?.errors,
    };
    figures.ceiling = runs.map((r) => ({
      ...r,
      callsPerSecond: round(r.callsPerSecond),
      eventsPerSecond: round(r.eventsPerSecond),
      redisCpuSecondsPerSecond: round(r.redisCpuSeconds / r.seconds, 3),
    }));
    // Each shape's mean over the rounds; the better shape is the ceiling.
    const byShape = shapes
      .map((shape) => {
        const mine = runs.filter((r) => r.clients === shape.clients && r.pipeline === shape.pipeline);
        return { ...shape, eventsPerSecond: median(mine.map((r) => r.eventsPerSecond)), n: mine.length };
      })
      .filter((s) => s.n > 0);
    figures.ceilingByShape = byShape.map((s) => ({ ...s, eventsPerSecond: round(s.eventsPerSecond) }));
    const best = byShape.reduce<(typeof byShape)[number] | undefined>(
      (a, r) => (!a || r.eventsPerSecond > a.eventsPerSecond ? r : a),
      undefined,
    );
    const target = ratioTarget(
      'acknowledged events/s, one node',
      'events/s',
      oursRate,
      best
        ? {
            name: `redis-benchmark EVALSHA append (-c ${best.clients} -P ${best.pipeline})`,
            value: best.eventsPerSecond,
          }
        : undefined,
      { atLeast: 0.5 },
      !opts.smoke,
    );
    figures.perSecond = series.map((s) => ({ ...s, rate: round(s.rate), p50: round(s.p50, 3), p99: round(s.p99, 3) }));
    return {
      figures,
      targets: [target],
      charts: [
        {
          kind: 'bars',
          file: 'throughput',
          title: `Acknowledged events/s (${BATCH} events of ${PAYLOAD_BYTES} B per frame)`,
          unit: 'events/s',
          bars: [
            { label: 'append', value: oursRate, who: `ours (${n} runners)` },
            ...byShape.map((r) => ({
              label: 'append',
              value: r.eventsPerSecond,
              who: `redis-benchmark -c ${r.clients} -P ${r.pipeline}`,
            })),
          ],
        },
        {
          kind: 'lines',
          file: 'latency',
          title: 'Frame sent to appended acknowledgement, each second',
          unit: 'ms',
          xLabel: 'second',
          series: [
            {
              name: 'p50',
              points: series.filter((s) => s.count).map((s) => [s.second, round(s.p50, 3)] as [number, number]),
            },
            {
              name: 'p99',
              points: series.filter((s) => s.count).map((s) => [s.second, round(s.p99, 3)] as [number, number]),
            },
          ],
        },
        {
          kind: 'lines',
          file: 'rate',
          title: 'Acknowledged events/s, each second',
          unit: 'events/s',
          xLabel: 'second',
          series: [{ name: 'ours', points: series.map((s) => [s.second, round(s.rate)] as [number, number]) }],
        },
      ],
      notes: [
        `${n} runners from ${opts.smoke ? 1 : 2} load-client process(es) speak the real runner protocol (ws, msgpack, core's schemas): hello, then numbered output frames of their own sandbox, each ${BATCH} stdout events of ${PAYLOAD_BYTES} B, at most ${WINDOW} frames unacknowledged; a frame counts when the service's \`appended\` (sent after the append) covers it. Measured over ${opts.duration} s after a ${warmup} s warm-up, in ${rounds} round(s) that alternate with the ceiling's runs (the runners pause meanwhile); ours and each ceiling shape are the medians of their rounds. The gateway appends the frames that queued behind a runner's append as one (a group commit, acknowledged by one \`appended\`); \`framesPerAppend\` in the JSON says how many frames an append carried on average. The service runs on a throwaway Redis (Redis adapter) and a throwaway PostgreSQL, as a deployment on Redis does; its log copier copies the events to Postgres meanwhile, as it always does.`,
        `Ceiling: redis-benchmark runs the service's own append Lua script (SCRIPT LOAD, then EVALSHA) on the same Redis with the same ${BATCH} events per call, the same stored JSON payload and key layout (tenant log, conversation stream, producer mark, live channel, trim point), a fresh producer per call (\`__rand_int__\` in its mark key, so every call appends; the entries added to the log stream are counted in Redis, and only those count), at two shapes with the depth ours has in flight (one append per runner): one connection pipelining ${n}, and ${n} connections. The better shape is the ceiling.`,
        'CPU per second of wall time of the gateway, Redis, Postgres and the load clients is in the JSON (BENCH_CPU_PROF=<dir> writes a CPU profile of the gateway over the measured window): on two cores, where it goes tells whether the gateway or Redis is the limit.',
        "Where the time goes (a profile of the gateway over the measured window, BENCH_CPU_PROF, Redis adapter on Postgres, Nov 2026): the append call (building each event's stored JSON and the ioredis command, its socket write) about a quarter of the gateway's CPU, uWebSockets.js sends of the `appended` acknowledgements about a tenth (a write per acknowledgement), garbage collection about a tenth, msgpack decoding and validation of the frames most of the rest. Per event the gateway spends roughly as much CPU as Redis spends running the script, so on two shared cores the pipeline (gateway + Redis + Postgres copy) needs two to three times the CPU per event of the ceiling (Redis alone: about 7 µs per event here, against about 10 µs in the gateway plus 8 µs in Redis plus the copy to Postgres).",
      ],
      clientCpuSeconds: clientCpu + benchCpu,
    };
  },
};
