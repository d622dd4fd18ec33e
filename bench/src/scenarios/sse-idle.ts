import { startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import { rssOfTree, sleep } from '../lib/proc.ts';
import { startRedis } from '../lib/redis.ts';
import { absoluteTarget, type Outcome, ratioTarget, type Scenario, type Target } from '../lib/scenario.ts';
import { round } from '../lib/stats.ts';
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

interface Held {
  system: string;
  asked: number;
  held: number;
  failed: number;
  openSeconds: number;
  rssBefore: number;
  rssAfter: number;
  /** (RSS after - RSS before) / held. */
  rssBytesPerWatcher: number;
  /**
   * What a watcher costs: the RSS delta, less the change in the V8 heap's committed but unused
   * room where the heap can be read (ours and the floor), over the number held.
   */
  bytesPerWatcher: number;
  /** The V8 heap before and after, where it can be read. */
  heap?: { before: HeapReading; after: HeapReading };
  failures: string[];
}

/** A V8 heap after a full GC: committed, and used by live objects. */
type HeapReading = { total: number; used: number };
/** The V8 heap's committed room that no live object uses (none known: 0). */
const unused = (h?: HeapReading) => (h ? h.total - h.used : 0);

/**
 * Memory per held SSE watcher: N authenticated `/api/events/stream` watchers on one edge
 * process of ours, and the same N EventSource subscribers on Nchan (one worker, a channel per
 * subscriber) and on a bare uWebSockets.js server. Memory per watcher is the server's RSS
 * after all are held and settled minus its RSS before, over the number held; for the Node
 * servers (ours, the floor) read after a full GC and less the change in the V8 heap's committed
 * but unused room, which moves with the collector's sizing rather than with the watchers. A
 * full run then holds 50,000 (or --connections, when above 18,000) across EDGE_PROCESSES edge
 * processes sharing the port (SO_REUSEPORT), on Redis and Postgres.
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
      v8?: { collect(): Promise<unknown>; heap(): Promise<HeapReading> },
    ): Promise<Held> => {
      await sleep(opts.smoke ? 200 : 1000);
      await v8?.collect();
      const rssBefore = await settledRss(rss, opts.smoke ? 1 : 5);
      const heapBefore = await v8?.heap();
      const started = Date.now();
      const fleet = startFleet({ port, ready, watchers });
      try {
        await fleet.opened(180_000, (s) =>
          progress.update(`${system}: ${s.held}/${watchers.length} held, ${s.failed} failed`),
        );
        const openSeconds = (Date.now() - started) / 1000;
        await progress.countdown(opts.duration, () => `${system}: holding ${fleet.status().held}`);
        await v8?.collect();
        const rssAfter = await settledRss(rss, opts.smoke ? 1 : 5);
        const heapAfter = await v8?.heap();
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
          bytesPerWatcher: perWatcher(rssAfter - rssBefore - (unused(heapAfter) - unused(heapBefore))),
          ...(heapBefore && heapAfter ? { heap: { before: heapBefore, after: heapAfter } } : {}),
          failures: report.failures,
        };
        progress.say(
          `${system}: ${held}/${watchers.length} held (opened in ${result.openSeconds} s), ${result.bytesPerWatcher} bytes per watcher (RSS ${mib(rssBefore)} -> ${mib(rssAfter)} MiB${heapBefore && heapAfter ? `; V8 heap used ${mib(heapBefore.used)} -> ${mib(heapAfter.used)}, committed ${mib(heapBefore.total)} -> ${mib(heapAfter.total)} MiB` : ''})${result.failed ? `, ${result.failed} failed: ${report.failures[0]}` : ''}`,
        );
        return result;
      } finally {
        await fleet.close();
        clientCpu += fleet.cpuSeconds();
      }
    };

    // Ours: one edge process; Postgres outside it, as deployed (and so PGlite's heap is not
    // counted as watchers' memory).
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
    // Redis and Postgres shared by them.
    let many: (Held & { processes: number }) | undefined;
    let manyNote: string | undefined;
    const manyN = opts.connections > ONE_EDGE ? opts.connections : MANY_EDGES;
    if (!opts.smoke) {
      const redis = await startRedis();
      defer(() => redis.stop());
      const multi = await startOurs(
        { ...QUIET_STREAMS, EDGE_PROCESSES: String(EDGE_PROCESSES), REDIS_URL: redis.url, DATABASE_URL: pg.url },
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
          many = {
            ...(await hold(`ours, ${supported} edge processes`, multi.port, ': connected', watchers, () =>
              rssOfTree(multi.pid),
            )),
            processes: supported,
          };
        }
      } finally {
        await multi.stop();
      }
    }

    const decide = !opts.smoke;
    const targets: Target[] = [
      absoluteTarget('watchers held by one edge process', 'watchers', oursHeld.held, { atLeast: ONE_EDGE }, decide),
      ratioTarget(
        'memory per held watcher',
        'B',
        oursHeld.bytesPerWatcher,
        nchanHeld && { name: 'Nchan', value: nchanHeld.bytesPerWatcher },
        { atMost: 0.4 },
        decide,
      ),
      {
        ...ratioTarget(
          'memory per held watcher, RSS delta alone',
          'B',
          oursHeld.rssBytesPerWatcher,
          nchanHeld && { name: 'Nchan', value: nchanHeld.rssBytesPerWatcher },
          { atMost: 0.4 },
          false,
        ),
        goal: 'reported',
      },
      {
        ...ratioTarget(
          'memory per held watcher against the floor',
          'B',
          oursHeld.bytesPerWatcher,
          { name: 'bare uWebSockets.js', value: floorHeld.bytesPerWatcher },
          { atMost: 1 },
          false,
        ),
        goal: 'reported (share of the floor)',
      },
    ];
    if (nchanError) (targets[1] as Target).note = `Nchan not measured: ${nchanError}`;
    if (!opts.smoke) {
      targets.push(
        many
          ? absoluteTarget(
              `watchers held across ${many.processes} edge processes on one port`,
              'watchers',
              many.held,
              { atLeast: MANY_EDGES },
              decide,
            )
          : {
              what: `watchers held across edge processes on one port`,
              unit: 'watchers',
              value: Number.NaN,
              goal: `>= ${MANY_EDGES} watchers`,
              met: null,
              note: manyNote,
            },
      );
    }

    const systems = [oursHeld, nchanHeld, floorHeld].filter((x): x is Held => x !== undefined);
    const who = (s: string) => (s === 'ours' ? 'ours' : s === 'Nchan' ? 'Nchan' : 'floor');
    const bars: Bar[] = systems.map((s) => ({ label: s.system, value: s.bytesPerWatcher, who: who(s.system) }));
    if (many) bars.push({ label: many.system, value: many.bytesPerWatcher, who: 'ours' });
    return {
      figures: {
        watchers: n,
        oursHeapBytesPerWatcher: heapUsedPerWatcher(oursHeld),
        settleSeconds: opts.duration,
        ours: oursHeld,
        nchan: nchanHeld ?? nchanError,
        floor: floorHeld,
        manyEdges: many ?? manyNote,
      },
      targets,
      charts: [
        { kind: 'bars', file: 'memory', title: 'Memory per held SSE watcher', unit: 'bytes', bars },
        {
          kind: 'bars',
          file: 'held',
          title: 'Watchers held',
          unit: 'watchers',
          bars: [...systems, ...(many ? [many] : [])].map((s) => ({
            label: s.system,
            value: s.held,
            who: who(s.system),
          })),
        },
      ],
      notes: [
        `${n} watchers per system, opened from child processes (at most 5,000 sockets each, each from its own loopback source address), held ${opts.duration} s, then memory read.`,
        'Ours: authenticated `GET /api/events/stream` (one bench account, bearer API key), one service process on a throwaway Postgres, heartbeats and idle close off for the hold. Each RSS figure is the least of five readings over a second, for every system alike.',
        `Memory per watcher: RSS after minus RSS before, over the number held. For the two Node processes (ours and the floor, both run with --expose-gc and read after a full GC) the change in the V8 heap's committed but unused room is taken out: V8 keeps the young generation's semispaces and freed pages committed for a while after a collection, and gives them back when it sees fit, which moves RSS by tens of MB either way whatever the watchers cost (RSS alone gave ours ${oursHeld.rssBytesPerWatcher} B per watcher in this run; the reported row). Nchan: RSS alone.`,
        'Nchan: nginx with one worker, `nchan_subscriber eventsource` with one channel per subscriber; RSS of master and worker. Floor: a bare uWebSockets.js server holding the responses in a Set per channel.',
        `Across edge processes: ${manyN} watchers of one account on a service started with EDGE_PROCESSES=${EDGE_PROCESSES} (SO_REUSEPORT; Redis and the same throwaway Postgres), from ${Math.ceil(manyN / 5000)} client processes; memory is the RSS of the primary and its edge processes, without a forced GC.`,
        'A watcher is held once the stream head and its first comment arrived (`: connected`; Nchan sends `: hi`).',
        `Ours: the V8 heap in use grew by ${heapUsedPerWatcher(oursHeld)} B per watcher (live objects after a full GC); its committed size went ${heapLine(oursHeld)}. The floor's heap in use grew by ${heapUsedPerWatcher(floorHeld)} B per watcher; committed ${heapLine(floorHeld)}.`,
      ],
      clientCpuSeconds: clientCpu,
    };
  },
};

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
const heapUsedPerWatcher = (h: Held) =>
  h.heap && h.held > 0 ? Math.round((h.heap.after.used - h.heap.before.used) / h.held) : Number.NaN;
const heapLine = (h: Held) => (h.heap ? `${mib(h.heap.before.total)} -> ${mib(h.heap.after.total)} MiB` : 'not read');
