import { startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import { rssOfTree, sleep } from '../lib/proc.ts';
import { startRedis } from '../lib/redis.ts';
import { absoluteTarget, type Outcome, ratioTarget, reported, type Scenario, type Target } from '../lib/scenario.ts';
import { median, round } from '../lib/stats.ts';
import type { Bar } from '../lib/svg.ts';
import { startNchan } from '../peers/nchan.ts';
import { startUwsFloor } from '../peers/uws-sse.ts';
import { startFleet, type WatcherSpec } from '../sse/fleet.ts';

/** Holds a stream open without a byte between `: connected` and the reading. */
const QUIET_STREAMS = { SSE_HEARTBEAT_MS: '3600000', SSE_IDLE_CLOSE_MS: '0' };
/** What one edge process is asked to hold (its open files are capped at 20,000). */
const ONE_EDGE = 18_000;
/** Past what one process may hold: the multi-edge phase. */
const MANY_EDGES = 50_000;
const EDGE_PROCESSES = 3;
/** Watchers opened and closed before the first reading (see hold). */
const WARM_UP = 1000;
/** Rounds of full collections before each reading (see collectSettled). */
const COLLECTIONS = 4;
/** Runs of the multi-edge phase, each on a fresh service: its figure is their median. */
const MANY_RUNS = 3;
/** The multi-edge phase of a smoke run: small, only proving it produces figures. */
const SMOKE_MANY = 600;

interface Held {
  system: string;
  asked: number;
  held: number;
  failed: number;
  openSeconds: number;
  rssBefore: number;
  rssAfter: number;
  /** (RSS after - RSS before) / held; both after a full collection where one can be run. */
  rssBytesPerWatcher: number;
  /** (V8 heap used after - before) / held, both after a full GC, where the heap can be read. */
  heapBytesPerWatcher: number;
  /** The V8 heap before and after, where it can be read. */
  heap?: { before: HeapReading; after: HeapReading };
  failures: string[];
}

/** A V8 heap after a full GC: committed, and used by live objects. */
type HeapReading = { total: number; used: number };

/**
 * Memory per held SSE watcher: N authenticated `/api/events/stream` watchers on one edge
 * process of ours, and the same N EventSource subscribers on Nchan (one worker, a channel per
 * subscriber) and on a bare uWebSockets.js server: RSS per watcher (the server's RSS after all
 * are held and settled minus before, over the number held) and, for the Node servers (ours,
 * the floor), the live V8 heap per watcher after a full GC. Then MANY_RUNS times, each on a
 * fresh service, 50,000 (or --connections, when above 18,000) across EDGE_PROCESSES edge
 * processes sharing the port (SO_REUSEPORT) on Redis and Postgres: the median RSS per watcher
 * against Nchan's (one run in a smoke run).
 */
export const sseIdle: Scenario = {
  name: 'sse-idle',
  title: 'sse-idle: memory per held SSE watcher, ours against Nchan and a bare uWebSockets.js server',
  defaults: { connections: ONE_EDGE, duration: 5, rate: 0 },
  smoke: { connections: 1000, duration: 1, rate: 0 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const n = Math.min(opts.connections, ONE_EDGE);
    let clientCpu = 0;

    /** Opens `watchers`, holds them `settleMs`, reads memory, closes them. */
    const hold = async (
      system: string,
      port: number,
      ready: string,
      watchers: WatcherSpec[],
      rss: () => number,
      v8?: { collect(): Promise<unknown>; heap?(): Promise<HeapReading> },
    ): Promise<Held> => {
      // A warm-up: the paths a watcher takes are compiled and their caches filled before the
      // first reading, so they are not counted as watchers' memory (for every system alike).
      const warm = startFleet({ port, ready, watchers: watchers.slice(0, WARM_UP) });
      try {
        await warm.opened(60_000);
        await sleep(opts.smoke ? 200 : 1000);
      } finally {
        await warm.close();
      }
      await sleep(opts.smoke ? 200 : 1000);
      await collectSettled(v8);
      const rssBefore = await settledRss(rss, opts.smoke ? 1 : 5);
      const heapBefore = await v8?.heap?.();
      const started = Date.now();
      const fleet = startFleet({ port, ready, watchers });
      try {
        await fleet.opened(180_000, (s) =>
          progress.update(`${system}: ${s.held}/${watchers.length} held, ${s.failed} failed`),
        );
        const openSeconds = (Date.now() - started) / 1000;
        await progress.countdown(opts.duration, () => `${system}: holding ${fleet.status().held}`);
        await collectSettled(v8);
        const rssAfter = await settledRss(rss, opts.smoke ? 1 : 5);
        const heapAfter = await v8?.heap?.();
        const s = fleet.status();
        const report = await fleet.report();
        const held = s.held - s.closed;
        const perWatcher = (bytes: number) => (held > 0 ? Math.round(bytes / held) : Number.NaN);
        const result: Held = {
          system,
          asked: watchers.length,
          held,
          failed: s.failed + s.closed,
          openSeconds: round(openSeconds),
          rssBefore,
          rssAfter,
          rssBytesPerWatcher: perWatcher(rssAfter - rssBefore),
          heapBytesPerWatcher: heapBefore && heapAfter ? perWatcher(heapAfter.used - heapBefore.used) : Number.NaN,
          ...(heapBefore && heapAfter ? { heap: { before: heapBefore, after: heapAfter } } : {}),
          failures: report.failures,
        };
        progress.say(
          `${system}: ${held}/${watchers.length} held (opened in ${result.openSeconds} s), ${result.rssBytesPerWatcher} bytes of RSS per watcher (RSS ${mib(rssBefore)} -> ${mib(rssAfter)} MiB${heapBefore && heapAfter ? `; V8 heap used ${mib(heapBefore.used)} -> ${mib(heapAfter.used)}, committed ${mib(heapBefore.total)} -> ${mib(heapAfter.total)} MiB` : ''})${result.failed ? `, ${result.failed} failed: ${report.failures[0]}` : ''}`,
        );
        return result;
      } finally {
        await fleet.close();
        clientCpu += fleet.cpuSeconds();
      }
    };

    // Ours: one edge process; Postgres outside it, as deployed (and so the database's memory
    // is not counted as watchers' memory).
    progress.update('starting Postgres');
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const ours = await startOurs({ ...QUIET_STREAMS, DATABASE_URL: pg.url }, ['--expose-gc']);
    let oursHeld: Held;
    try {
      const me = await ours.call<{ key: string }>('tenant#signUp');
      const watchers = Array.from({ length: n }, () => ({
        path: '/api/events/stream',
        authorization: `Bearer ${me.key}`,
      }));
      oursHeld = await hold('ours', ours.port, ': connected', watchers, () => rssOfTree(ours.pid), {
        collect: () => ours.call('ops/memory#collect'),
        heap: () => ours.call<HeapReading>('ops/memory#heap'),
      });
    } finally {
      await ours.stop();
    }

    const channels = (count: number) => Array.from({ length: count }, (_, i) => ({ path: `/sub/c${i}` }));
    let nchanHeld: Held | undefined;
    let nchanError: string | undefined;
    try {
      const nchan = await startNchan({ connections: n }, (s) => progress.say(s));
      try {
        nchanHeld = await hold('Nchan', nchan.port, ': hi', channels(n), nchan.rss);
        nchanHeld.failures.push(...nchan.errors());
      } finally {
        await nchan.stop();
      }
    } catch (err) {
      nchanError = (err as Error).message;
      progress.say(`Nchan not measured: ${nchanError}`);
    }

    const floor = await startUwsFloor(['--expose-gc']);
    let floorHeld: Held;
    try {
      const floorHeap = async () =>
        (await fetch(`http://127.0.0.1:${floor.port}/memory`)).json() as Promise<HeapReading>;
      floorHeld = await hold('uWebSockets.js floor', floor.port, ': connected', channels(n), floor.rss, {
        collect: floorHeap,
        heap: floorHeap,
      });
    } finally {
      await floor.stop();
    }

    // Past one process: EDGE_PROCESSES edge processes on one port (SO_REUSEPORT), which needs
    // Redis and Postgres shared by them. MANY_RUNS runs, each on a fresh service.
    const manyRuns: (Held & { processes: number })[] = [];
    let manyNote: string | undefined;
    const manyN = opts.smoke ? SMOKE_MANY : opts.connections > ONE_EDGE ? opts.connections : MANY_EDGES;
    const redis = await startRedis();
    defer(() => redis.stop());
    // A smoke run makes one: it shows the phase produces figures, which a median need not.
    const manyRunCount = opts.smoke ? 1 : MANY_RUNS;
    for (let run = 0; run < manyRunCount && !manyNote; run++) {
      const multi = await startOurs(
        {
          ...QUIET_STREAMS,
          EDGE_PROCESSES: String(EDGE_PROCESSES),
          REDIS_URL: redis.url,
          REDIS_KEY_PREFIX: `bench${Date.now()}:`,
          DATABASE_URL: pg.url,
        },
        ['--expose-gc'],
      );
      try {
        const supported = await multi.call<number | null>('ops/memory#edgeProcesses');
        if (supported === null) {
          manyNote = 'this build has no EDGE_PROCESSES: not measured';
        } else {
          const me = await multi.call<{ key: string }>('tenant#signUp');
          const watchers = Array.from({ length: manyN }, () => ({
            path: '/api/events/stream',
            authorization: `Bearer ${me.key}`,
          }));
          manyRuns.push({
            ...(await hold(
              `ours, ${supported} edge processes, run ${run + 1}/${manyRunCount}`,
              multi.port,
              ': connected',
              watchers,
              () => rssOfTree(multi.pid),
            )),
            processes: supported,
          });
        }
      } finally {
        await multi.stop();
      }
    }
    const manyRss = median(manyRuns.map((r) => r.rssBytesPerWatcher));
    const manyHeld = Math.min(...manyRuns.map((r) => r.held));
    const processes = manyRuns[0]?.processes ?? EDGE_PROCESSES;

    const decide = !opts.smoke;
    const nchanRss = nchanHeld && { name: 'Nchan, one worker', value: nchanHeld.rssBytesPerWatcher };
    const targets: Target[] = [
      absoluteTarget('watchers held by one edge process', 'watchers', oursHeld.held, { atLeast: ONE_EDGE }, decide),
      manyRuns.length
        ? absoluteTarget(
            `watchers held across ${processes} edge processes on one port (least of ${manyRuns.length} runs)`,
            'watchers',
            manyHeld,
            { atLeast: manyN },
            decide,
          )
        : {
            what: 'watchers held across edge processes on one port',
            unit: 'watchers',
            value: Number.NaN,
            goal: `>= ${manyN} watchers`,
            met: null,
            note: manyNote,
          },
      ratioTarget(
        `RSS per watcher with ${manyN.toLocaleString('en-US')} held across ${processes} edge processes (median of ${manyRuns.length} runs)`,
        'B',
        manyRss,
        nchanRss,
        { atMost: 0.25 },
        decide && manyRuns.length > 0,
      ),
      ratioTarget(
        'live heap memory per watcher, one edge process (V8 heap used, after a full GC)',
        'B',
        oursHeld.heapBytesPerWatcher,
        { name: 'bare uWebSockets.js', value: floorHeld.heapBytesPerWatcher },
        { atMost: 3 },
        decide,
      ),
      reported(
        ratioTarget(
          `RSS per watcher with ${n.toLocaleString('en-US')} held by one edge process`,
          'B',
          oursHeld.rssBytesPerWatcher,
          nchanRss,
          { atMost: 0.25 },
        ),
      ),
      reported(
        ratioTarget(
          `RSS per watcher with ${n.toLocaleString('en-US')} held by one edge process, against the floor`,
          'B',
          oursHeld.rssBytesPerWatcher,
          { name: 'bare uWebSockets.js', value: floorHeld.rssBytesPerWatcher },
          { atMost: 1 },
        ),
        'reported (multiple of the floor)',
      ),
    ];
    if (manyNote) (targets[2] as Target).note = manyNote;
    if (nchanError) {
      for (const t of [targets[2], targets[4]] as Target[]) t.note = `Nchan not measured: ${nchanError}`;
    }

    const systems = [oursHeld, nchanHeld, floorHeld].filter((x): x is Held => x !== undefined);
    const who = (s: string) => (s.startsWith('ours') ? 'ours' : s === 'Nchan' ? 'Nchan' : 'floor');
    const bars: Bar[] = [...systems, ...manyRuns].map((s) => ({
      label: s.system,
      value: s.rssBytesPerWatcher,
      who: who(s.system),
    }));
    return {
      figures: {
        watchers: n,
        oursHeapBytesPerWatcher: oursHeld.heapBytesPerWatcher,
        floorHeapBytesPerWatcher: floorHeld.heapBytesPerWatcher,
        settleSeconds: opts.duration,
        ours: oursHeld,
        nchan: nchanHeld ?? nchanError,
        floor: floorHeld,
        manyEdges: manyRuns.length ? { watchers: manyN, medianRssBytesPerWatcher: manyRss, runs: manyRuns } : manyNote,
      },
      targets,
      charts: [
        { kind: 'bars', file: 'memory', title: 'RSS per held SSE watcher', unit: 'bytes', bars },
        {
          kind: 'bars',
          file: 'heap',
          title: 'Live V8 heap per held SSE watcher (after a full GC)',
          unit: 'bytes',
          bars: [oursHeld, floorHeld].map((s) => ({
            label: s.system,
            value: s.heapBytesPerWatcher,
            who: who(s.system),
          })),
        },
        {
          kind: 'bars',
          file: 'held',
          title: 'Watchers held',
          unit: 'watchers',
          bars: [...systems, ...manyRuns].map((s) => ({
            label: s.system,
            value: s.held,
            who: who(s.system),
          })),
        },
      ],
      notes: [
        `${n} watchers per system on one process, opened from child processes (at most 5,000 sockets each, each from its own loopback source address), held ${opts.duration} s, then memory read.`,
        `Ours: authenticated \`GET /api/events/stream\` (one bench account, bearer API key), one service process on a throwaway Postgres, heartbeats and idle close off for the hold. Each RSS figure is the least of five readings over a second, for every system alike. Before the first reading every system first opens and closes ${WARM_UP} watchers (a warm-up), and the Node servers run ${COLLECTIONS} rounds of two full collections before each reading (V8 gives some memory back only over several collections). RSS read after collections is a lower bound (pages a collection frees stay committed and new objects fill them), so the one-process RSS rows are reported, not judged.`,
        `RSS per watcher: RSS after minus RSS before, over the number held (of every process of the server: nginx's master and worker; ours' primary and its edge processes). Nchan's figure is one worker holding ${n} subscribers.`,
        `Across edge processes: ${manyN} watchers of one account on a service started with EDGE_PROCESSES=${EDGE_PROCESSES} (SO_REUSEPORT; one Redis and the same throwaway Postgres), from ${Math.ceil(manyN / 5000)} client processes, after the same warm-up; memory is the RSS of the primary and its edge processes, read without a forced collection (the edge processes answer no bench calls), so it counts the openings' garbage V8 has not collected yet: an upper bound, which moves with when V8 collects (on an idle service its memory reducer takes that garbage back within about a minute and a half: on 2026-11-27, without the warm-up, 50,000 held across 3 processes read 3,180 B per watcher right after opening, 2,774 B a minute later, and below the reading before the opening at 90 s). Collections forced in every process by a signal were tried and dropped: the RSS after them came out below the live heap per watcher, and below zero in two of three runs (pages a collection frees stay committed and the watchers' objects fill them). ${manyRuns.length} runs, each on a fresh service: ${manyRuns.map((r) => `${r.rssBytesPerWatcher} B (${r.held} held)`).join(', ')}; the row is their median.`,
        `Live heap per watcher: the V8 heap in use after a full GC (node --expose-gc; two collections 50 ms apart), after minus before, over the number held; ours (one edge process) ${oursHeld.heapBytesPerWatcher} B, committed ${heapLine(oursHeld)}; the bare uWebSockets.js floor ${floorHeld.heapBytesPerWatcher} B, committed ${heapLine(floorHeld)}. The floor keeps each response in a Set per channel and nothing else: what any uWebSockets.js SSE server must hold.`,
        "The RSS delta less V8's committed but unused room is no longer a row: it was the difference of two figures tens of MB apart and swung from below zero to above the RSS delta between runs.",
        'Nchan: nginx with one worker, `nchan_subscriber eventsource` with one channel per subscriber; RSS of master and worker. Floor: a bare uWebSockets.js server holding the responses in a Set per channel.',
        'A watcher is held once the stream head and its first comment arrived (`: connected`; Nchan sends `: hi`).',
      ],
      clientCpuSeconds: clientCpu,
    };
  },
};

/**
 * Full collections, COLLECTIONS rounds, for the live-heap reading: V8 gives some memory back
 * only over several collections (it flushes the bytecode of functions unused for a few of
 * them). The RSS rows read after them are reported only: RSS after collections came out below
 * the bare floor's in some runs, since pages a collection frees stay committed.
 */
async function collectSettled(v8: { collect(): Promise<unknown> } | undefined): Promise<void> {
  if (!v8) return;
  for (let i = 0; i < COLLECTIONS; i++) await v8.collect();
}

/** The least of `readings` a quarter second apart: RSS moves by megabytes as a collector returns pages. */
async function settledRss(rss: () => number, readings: number): Promise<number> {
  let least = rss();
  for (let i = 1; i < readings; i++) {
    await sleep(250);
    least = Math.min(least, rss());
  }
  return least;
}

const mib = (b: number) => (b / 2 ** 20).toFixed(1);
const heapLine = (h: Held) => (h.heap ? `${mib(h.heap.before.total)} -> ${mib(h.heap.after.total)} MiB` : 'not read');
