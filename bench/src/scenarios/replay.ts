import { fork } from 'node:child_process';
import { join } from 'node:path';
import type { ReaderJob, ReaderResult } from '../clients/replay-reader.ts';
import { benchModule } from '../lib/child-module.ts';
import { repoRoot } from '../lib/machine.ts';
import { startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import { cpuSecondsOf, rssOf, stopChild } from '../lib/proc.ts';
import { startRedis } from '../lib/redis.ts';
import { absoluteTarget, type Outcome, ratioTarget, type Scenario, type Target } from '../lib/scenario.ts';
import { median, round } from '../lib/stats.ts';
import type { Bar, Series } from '../lib/svg.ts';
import type { ReplayFixture } from '../ops/replay.ts';

/** Page size of the raw readers: the page follow() reads history in. */
const PAGE = 1000;

/** One reader in its own process; resolves with its result and the CPU it used. */
async function runReader(job: ReaderJob): Promise<ReaderResult & { cpuSeconds: number }> {
  const reader = benchModule(join(repoRoot, 'bench/src/clients/replay-reader.ts'));
  const child = fork(reader.script, [], {
    cwd: repoRoot,
    execArgv: reader.execArgv,
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  try {
    const result = await new Promise<ReaderResult>((resolve, reject) => {
      child.on('message', (m: { type: string }) => {
        if (m.type === 'ready') child.send(job);
        else if (m.type === 'result') resolve(m as ReaderResult);
      });
      child.once('exit', (code, signal) => reject(new Error(`replay reader exited (${code ?? signal})`)));
    });
    let cpuSeconds = 0;
    try {
      cpuSeconds = cpuSecondsOf(child.pid as number);
    } catch {
      // gone already
    }
    child.send({ type: 'bye' });
    return { ...result, cpuSeconds };
  } finally {
    await stopChild(child, 2000);
  }
}

type Kind = 'conversation' | 'tenant' | 'selectCold' | 'xrangeHot' | 'selectAll';
const LABEL: Record<Kind, string> = {
  conversation: 'ours: /api/conversations/:id/stream',
  tenant: 'ours: /api/events/stream',
  selectCold: 'raw SELECT, cold part (Postgres only)',
  xrangeHot: 'raw XRANGE, hot part (Redis tail)',
  selectAll: 'raw SELECT, whole range',
};

/**
 * A watcher reconnecting with `Last-Event-ID` behind N events: the older part of the range is in
 * Postgres only (the copier trimmed Redis to the newest LOG_HOT_EVENTS = N/10), the rest also in
 * Redis's hot tail. Measures the time to the first byte and the first event and events/s to
 * catch up, on the conversation stream and the multiplexed tenant stream, against raw reads of
 * the same range from other processes: SELECT in pages for the cold part plus XRANGE in pages
 * for the hot part. `--rate` is N (events behind), `--duration` the number of rounds;
 * `--connections` does not apply (one watcher).
 */
export const replay: Scenario = {
  name: 'replay',
  title: 'replay: a watcher reconnecting with Last-Event-ID behind N events, against raw XRANGE + SELECT',
  defaults: { connections: 1, duration: 5, rate: 100_000 },
  smoke: { connections: 1, duration: 1, rate: 2_000 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const total = Math.max(100, Math.round(opts.rate));
    const rounds = Math.max(1, Math.round(opts.duration));
    const hot = Math.max(10, Math.round(total / 10));

    progress.update('starting redis and postgres');
    let redisUrl = opts.redis;
    if (!redisUrl) {
      const redis = await startRedis();
      defer(() => redis.stop());
      redisUrl = redis.url;
    }
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const profileDir = process.env.BENCH_CPU_PROF;
    progress.update('starting our service');
    const target = await startOurs(
      {
        REDIS_URL: redisUrl,
        REDIS_KEY_PREFIX: `bench-replay-${process.pid}-${Date.now()}:`,
        DATABASE_URL: pg.url,
        LOG_HOT_EVENTS: String(hot),
        LOG_COPY_INTERVAL_MS: '100',
      },
      profileDir ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : [],
    );
    defer(() => target.stop());

    progress.update(`appending ${total} events and waiting for the copy to be durable`);
    const fx = await target.call<ReplayFixture>('ops/replay#prepare', { events: total });
    progress.say(
      `${total} events appended in ${Math.round(fx.appendMs)} ms, durable in Postgres ${Math.round(fx.copyMs)} ms later; ` +
        `Redis tail holds the newest ${fx.hotEvents}, ${fx.tenantEvents - fx.hotEvents} are in Postgres only`,
    );

    const jobs: Record<Kind, ReaderJob> = {
      conversation: {
        mode: 'sse',
        port: target.port,
        path: `/api/conversations/${fx.conversationId}/stream`,
        key: fx.key,
        after: fx.after,
        last: fx.last,
        timeoutMs: 120_000,
      },
      tenant: {
        mode: 'sse',
        port: target.port,
        path: '/api/events/stream',
        key: fx.key,
        after: fx.after,
        last: fx.last,
        timeoutMs: 120_000,
      },
      selectCold: {
        mode: 'select',
        pgUrl: pg.url,
        accountId: fx.accountId,
        after: fx.after,
        last: fx.floor - 1,
        page: PAGE,
      },
      xrangeHot: {
        mode: 'xrange',
        redisUrl,
        key: fx.tenantLogKey,
        after: Math.max(fx.after, fx.floor - 1),
        last: fx.last,
        page: PAGE,
      },
      selectAll: { mode: 'select', pgUrl: pg.url, accountId: fx.accountId, after: fx.after, last: fx.last, page: PAGE },
    };
    const kinds = Object.keys(jobs) as Kind[];
    const results: Record<Kind, (ReaderResult & { cpuSeconds: number })[]> = {
      conversation: [],
      tenant: [],
      selectCold: [],
      xrangeHot: [],
      selectAll: [],
    };
    const server: Record<'conversation' | 'tenant', { cpuSeconds: number; rssGrowth: number }[]> = {
      conversation: [],
      tenant: [],
    };
    let clientCpu = 0;
    // Right after the bulk copy, before autovacuum has analyzed the table: once each.
    const fresh: Partial<Record<Kind, ReaderResult>> = {};
    for (const kind of ['conversation', 'tenant', 'selectAll'] as const) {
      progress.update(`before ANALYZE: ${LABEL[kind]}`);
      const res = await runReader(jobs[kind]);
      clientCpu += res.cpuSeconds;
      fresh[kind] = res;
      progress.say(
        `before ANALYZE ${LABEL[kind]}: ${res.events} events in ${round(res.totalMs, 1)} ms = ${Math.round(res.events / (res.totalMs / 1000))} events/s, first event ${round(res.firstEventMs, 2)} ms${res.error ? ` ERROR ${res.error}` : ''}`,
      );
    }
    await target.call('ops/replay#analyze');
    for (let r = 0; r < rounds; r++) {
      // Alternate the order so a warming cache or a noisy neighbour does not favour one side.
      const order = r % 2 === 0 ? kinds : [...kinds].reverse();
      for (const kind of order) {
        progress.update(`round ${r + 1}/${rounds}: ${LABEL[kind]}`);
        const ours = kind === 'conversation' || kind === 'tenant';
        const cpuBefore = ours ? cpuSecondsOf(target.pid) : 0;
        const rssBefore = ours ? rssOf(target.pid) : 0;
        let rssPeak = rssBefore;
        const sampler = ours
          ? setInterval(() => {
              try {
                rssPeak = Math.max(rssPeak, rssOf(target.pid));
              } catch {
                // exited
              }
            }, 20)
          : undefined;
        const res = await runReader(jobs[kind]).finally(() => clearInterval(sampler));
        clientCpu += res.cpuSeconds;
        results[kind].push(res);
        if (ours) {
          server[kind].push({ cpuSeconds: cpuSecondsOf(target.pid) - cpuBefore, rssGrowth: rssPeak - rssBefore });
        }
        const rate = res.events / (res.totalMs / 1000);
        progress.say(
          `round ${r + 1} ${LABEL[kind]}: ${res.events} events in ${round(res.totalMs, 1)} ms = ${Math.round(rate)} events/s` +
            (ours ? `, first byte ${round(res.firstByteMs, 2)} ms, first event ${round(res.firstEventMs, 2)} ms` : '') +
            (res.error ? ` ERROR ${res.error}` : ''),
        );
      }
    }

    const rateOf = (x: ReaderResult) => (x.error ? Number.NaN : x.events / (x.totalMs / 1000));
    const med = (kind: Kind, f: (x: ReaderResult) => number) => median(results[kind].map(f));
    const rates = Object.fromEntries(kinds.map((k) => [k, med(k, rateOf)])) as Record<Kind, number>;
    // The fair baseline reads the range the way a reader must, one page after another: the cold
    // part from Postgres, then the hot part from Redis. Its rate is all those events over the
    // sum of the two times (per round, then the median).
    const combined = median(
      results.selectCold.map((c, i) => {
        const h = results.xrangeHot[i] as ReaderResult;
        return (c.events + h.events) / ((c.totalMs + h.totalMs) / 1000);
      }),
    );
    const baseline = { name: 'raw SELECT (cold) then XRANGE (hot)', value: combined };
    const decide = !opts.smoke;
    const targets: Target[] = [];
    const figures: Record<string, unknown> = {
      eventsBehind: total,
      rounds,
      hotTailEvents: fx.hotEvents,
      coldEvents: fx.tenantEvents - fx.hotEvents,
      tenantEventsInRange: fx.tenantEvents,
      lastEventId: fx.after,
      copyMark: fx.copiedUpTo,
      trimPoint: fx.floor,
      appendMs: round(fx.appendMs),
      copyMs: round(fx.copyMs),
      pageSize: PAGE,
      baselineEventsPerSecond: round(combined),
    };
    figures.beforeAnalyze = Object.fromEntries(
      Object.entries(fresh).map(([k, x]) => [
        k,
        {
          eventsPerSecond: round(rateOf(x)),
          totalMs: round(x.totalMs, 2),
          firstEventMs: round(x.firstEventMs, 3),
          error: x.error,
        },
      ]),
    );
    for (const kind of kinds) {
      const rs = results[kind];
      figures[kind] = {
        eventsPerSecond: round(rates[kind]),
        medianMs: round(med(kind, (x) => x.totalMs)),
        firstByteMs: round(
          med(kind, (x) => x.firstByteMs),
          3,
        ),
        firstEventMs: round(
          med(kind, (x) => x.firstEventMs),
          3,
        ),
        runs: rs.map((x) => ({
          events: x.events,
          bytes: x.bytes,
          totalMs: round(x.totalMs, 2),
          firstByteMs: round(x.firstByteMs, 3),
          firstEventMs: round(x.firstEventMs, 3),
          clientCpuSeconds: round(x.cpuSeconds, 3),
          error: x.error,
        })),
      };
    }
    for (const kind of ['conversation', 'tenant'] as const) {
      const rs = results[kind];
      const errors = rs.filter((x) => x.error).map((x) => x.error);
      const ss = server[kind];
      (figures[kind] as Record<string, unknown>).server = {
        cpuSecondsPerReplay: round(median(ss.map((s) => s.cpuSeconds)), 3),
        rssGrowthBytes: Math.round(median(ss.map((s) => s.rssGrowth))),
      };
      const t = ratioTarget(
        `${LABEL[kind]} replay events/s`,
        'events/s',
        rates[kind],
        baseline,
        { atLeast: 0.5 },
        decide,
      );
      const ttfe = absoluteTarget(
        `${LABEL[kind]} time to first event`,
        'ms',
        med(kind, (x) => x.firstEventMs),
        { atMost: 50 },
        decide,
      );
      if (errors.length) {
        t.met = false;
        t.note = `${errors.length} replay(s) failed: ${errors[0]}`;
        ttfe.met = false;
        ttfe.note = t.note;
      }
      targets.push(t, ttfe);
    }

    // Charts: throughput bars, first byte/event bars, catch-up progress over time (the last
    // round), and server memory growth while one watcher replays.
    const bars: Bar[] = [
      { label: 'conversation stream', value: rates.conversation, who: 'ours' },
      { label: 'tenant stream', value: rates.tenant, who: 'ours' },
      { label: 'SELECT cold + XRANGE hot', value: combined, who: 'raw read' },
      { label: 'SELECT cold part', value: rates.selectCold, who: 'raw read' },
      { label: 'XRANGE hot part', value: rates.xrangeHot, who: 'raw read' },
      { label: 'SELECT whole range', value: rates.selectAll, who: 'raw read' },
    ];
    for (const kind of ['conversation', 'tenant', 'selectAll'] as const) {
      const x = fresh[kind] as ReaderResult;
      bars.push({
        label: `${kind === 'selectAll' ? 'SELECT whole range' : `${kind} stream`}, before ANALYZE`,
        value: rateOf(x),
        who: kind === 'selectAll' ? 'raw read' : 'ours',
      });
    }
    const latencyBars: Bar[] = [];
    for (const kind of ['conversation', 'tenant'] as const) {
      latencyBars.push(
        { label: `${kind} first byte`, value: med(kind, (x) => x.firstByteMs), who: 'ours' },
        { label: `${kind} first event`, value: med(kind, (x) => x.firstEventMs), who: 'ours' },
      );
    }
    latencyBars.push({ label: 'first SELECT page', value: med('selectCold', (x) => x.firstByteMs), who: 'raw read' });
    latencyBars.push({ label: 'first XRANGE page', value: med('xrangeHot', (x) => x.firstByteMs), who: 'raw read' });
    const lastOf = (kind: Kind) => results[kind].at(-1) as ReaderResult;
    const cold = lastOf('selectCold');
    const hotRun = lastOf('xrangeHot');
    const coldEnd = cold.timeline.at(-1)?.[0] ?? 0;
    const series: Series[] = [
      { name: 'ours: conversation', points: lastOf('conversation').timeline },
      { name: 'ours: tenant', points: lastOf('tenant').timeline },
      {
        name: 'raw: SELECT then XRANGE',
        points: [
          ...cold.timeline,
          ...hotRun.timeline.map(([t, n]) => [t + coldEnd, n + cold.events] as [number, number]),
        ],
      },
      { name: 'raw: SELECT all', points: lastOf('selectAll').timeline },
    ];
    const memoryBars: Bar[] = (['conversation', 'tenant'] as const).map((kind) => ({
      label: `${kind} stream`,
      value: median(server[kind].map((s) => s.rssGrowth)) / 1024,
      who: 'ours',
    }));

    return {
      figures,
      targets,
      charts: [
        { kind: 'bars', file: 'throughput', title: `Replay of ${total} events`, unit: 'events/s', bars },
        { kind: 'bars', file: 'first-byte', title: 'Time to first byte / first event', unit: 'ms', bars: latencyBars },
        {
          kind: 'lines',
          file: 'catch-up',
          title: `Events caught up over time (round ${rounds})`,
          unit: 'events',
          xLabel: 'ms since the request',
          series,
        },
        {
          kind: 'lines',
          file: 'first-event-by-round',
          title: 'Time to first byte and first event, round by round',
          unit: 'ms',
          xLabel: 'round',
          series: (['conversation', 'tenant'] as const).flatMap((kind) => [
            {
              name: `${kind}: first byte`,
              points: results[kind].map((x, i) => [i + 1, x.firstByteMs] as [number, number]),
            },
            {
              name: `${kind}: first event`,
              points: results[kind].map((x, i) => [i + 1, x.firstEventMs] as [number, number]),
            },
          ]),
        },
        {
          kind: 'bars',
          file: 'memory',
          title: 'Server RSS growth while one watcher replays',
          unit: 'KiB',
          bars: memoryBars,
        },
      ],
      notes: [
        `${total} output events of one conversation appended through the write path (svc.appendEvents, batches of 100) on a throwaway Redis, copied by the copier into a throwaway PostgreSQL; LOG_HOT_EVENTS=${hot}, so Redis's tenant log keeps the newest ${fx.hotEvents} and the ${fx.tenantEvents - fx.hotEvents} older ones are in Postgres only. The watcher reconnects with Last-Event-ID = the id before the range and reads until the frame of the last id arrives (raw socket, its own process).`,
        `The baseline reads the same range from other processes, in pages of ${PAGE} (the page size follow() uses): SELECT of readStored's columns for the cold part (postgres library), then XRANGE on the tenant log for the hot part (ioredis). Its rate is all those events over the sum of the two times, since a reader reads the cold part and then the hot part, one page after another. The raw readers fetch rows and do nothing with them; ours parses, shapes, frames and writes each event to a socket.`,
        'Our read path (gateway/src/log/read.ts readLog) reads Postgres up to the copy mark and Redis only above it; once the copy is durable the whole range comes from Postgres, so "raw SELECT, whole range" is the raw read of what ours actually reads.',
        'The table is analyzed (ANALYZE log_events, what autovacuum does within a minute of a bulk load) before the measured rounds. Right after the copy, before that, each of ours and the raw SELECT is measured once ("before ANALYZE"): without statistics the planner reads every page of the tenant range as a bitmap scan of the whole rest of the range plus a sort, while the conversation stream\'s query uses the conversation index either way. Once the table has been analyzed at all, ranges newer than its statistics plan as ordered index scans (checked by EXPLAIN), so this concerns a table never analyzed.',
        'Time to first byte is the response head (`: connected` goes out before history is read); time to first event is when the first frame of history arrives, the figure the 50 ms target is held to. Both from the moment the request is written.',
        `--rate sets the events behind (default 100,000), --duration the number of rounds (default 5; medians reported), --redis an existing Redis; --connections does not apply. Set BENCH_CPU_PROF to write a CPU profile of our service.`,
      ],
      clientCpuSeconds: clientCpu,
    };
  },
};
