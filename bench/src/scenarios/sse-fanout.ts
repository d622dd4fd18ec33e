import { splitCores } from '../lib/cores.ts';
import type { Progress } from '../lib/progress.ts';
import { type Outcome, ratioTarget, reported, type Scenario, type Target } from '../lib/scenario.ts';
import { round } from '../lib/stats.ts';
import type { Bar, Chart } from '../lib/svg.ts';
import { type FanoutPlan, type FanoutResult, P99_WINDOWS, runFanout, type System } from '../sse/fanout.ts';

/** Watchers per conversation and conversations per tenant of the issue's layout (10,000 / 1,000 / 10). */
const PER_CONVERSATION = 10;
const MAX_TENANTS = 10;

export function fanoutPlan(opts: {
  connections: number;
  duration: number;
  rate: number;
  redis?: string;
  smoke?: boolean;
}): FanoutPlan {
  const conversations = Math.max(1, Math.round(opts.connections / PER_CONVERSATION));
  return {
    watchers: opts.connections,
    conversations,
    tenants: Math.min(MAX_TENANTS, conversations),
    rate: opts.rate,
    seconds: opts.duration,
    padding: 0,
    slow: 0,
    redis: opts.redis,
    // The steady state, on every system alike: the first seconds of a fresh process (JIT,
    // first allocations) showed as p99 spikes of the first run seconds.
    warmupSeconds: opts.smoke ? 0 : 5,
  };
}

const who = (s: System) => (s === 'floor' ? 'floor' : s);
const label = (s: System) => (s === 'floor' ? 'bare uWebSockets.js' : s);

/** Latency over time (p50 and p99 per second) and the overall percentiles, for any set of runs. */
export function latencyCharts(runs: { name: string; who: string; r: FanoutResult }[]): Chart[] {
  const over = (p: 'p50' | 'p99'): Chart => ({
    kind: 'lines',
    file: `latency-${p}`,
    title: `Append-to-receipt ${p} per second`,
    unit: 'ms',
    xLabel: 'seconds since publishing began',
    series: runs.map(({ name, r }) => ({
      name,
      points: r.perSecond.filter((s) => s.count > 0).map((s) => [s.second, s[p]] as const),
    })),
  });
  const bars: Bar[] = [];
  for (const p of ['p50', 'p99', 'p99.9'] as const) {
    for (const { name, who, r } of runs) bars.push({ label: `${p} ${name}`, value: r.latency[p] as number, who });
  }
  return [
    over('p50'),
    over('p99'),
    { kind: 'bars', file: 'latency', title: 'Append-to-receipt latency', unit: 'ms', bars },
  ];
}

/**
 * The order of the runs at each rate: every system once, then ours and Nchan again in the
 * mirrored order (a smoke run makes the first ones only). The CPU rows compare the means of
 * each's two runs, so the machine's drift over the minutes between them weighs on both sides.
 */
const FIRST_RUNS: System[] = ['ours', 'Nchan', 'floor'];
const SECOND_RUNS: System[] = ['Nchan', 'ours'];

/** The second rate of sse-fanout and sse-tenant, as a multiple of `--rate` (10k and 40k deliveries/s). */
export const HIGH_RATE_FACTOR = 4;
/** CPU per delivery, ours with its stores against Nchan with its publisher: at most this at the first rate... */
const CPU_TARGET_LOW = 1.0;
/** ...and at most this at the high rate. */
const CPU_TARGET_HIGH = 0.8;

const fmtParts = (r: FanoutResult) =>
  `${Object.entries(r.sideCpu.parts)
    .map(([k, v]) => `${k} ${v} s (kernel ${r.sideCpu.kernel[k]} s)`)
    .join(' + ')}${r.sideCpu.missing.length ? ` (not counted: ${r.sideCpu.missing.join(', ')})` : ''}`;

/**
 * Runs a fan-out plan on ours, Nchan and the bare uWebSockets.js floor, one after the other,
 * at the plan's rate and then at HIGH_RATE_FACTOR times it, with the server side and the load
 * clients on cores of their own where taskset allows, and compares: delivered events/s at least
 * Nchan's and p99 at most twice Nchan's at the first rate; CPU seconds per thousand deliveries
 * of ours with its Redis and Postgres at most Nchan's with its publisher (1.0x at the first
 * rate, 0.8x at the high one).
 */
async function compareFanout(
  plan: FanoutPlan,
  opts: { smoke?: boolean },
  progress: Progress,
  layoutNotes: string[],
  deliveriesPerEvent: number,
): Promise<Outcome> {
  const cores = splitCores();
  progress.say(`cores: ${cores.description}`);
  const rates = [plan.rate, plan.rate * HIGH_RATE_FACTOR];
  const byRate: Partial<Record<System, FanoutResult>>[] = [];
  /** The second run of ours and of Nchan at each rate (none in a smoke run). */
  const againByRate: Partial<Record<System, FanoutResult>>[] = [];
  const errors: Partial<Record<System, string>> = {};
  for (const rate of rates) {
    const results: Partial<Record<System, FanoutResult>> = {};
    const again: Partial<Record<System, FanoutResult>> = {};
    byRate.push(results);
    againByRate.push(again);
    for (const system of opts.smoke ? FIRST_RUNS : [...FIRST_RUNS, ...SECOND_RUNS]) {
      if (errors[system]) continue;
      const second = results[system] !== undefined;
      progress.say(
        `${system}: ${rate} events/s (${rate * deliveriesPerEvent} deliveries/s)${second ? ', second run' : ''}`,
      );
      try {
        const r = await runFanout(system, { ...plan, rate, cores }, progress);
        if (second) again[system] = r;
        else results[system] = r;
      } catch (err) {
        if (system === 'ours') throw err;
        errors[system] = (err as Error).message;
        progress.say(`${system} not measured: ${errors[system]}`);
      }
    }
  }
  // What the Redis round trip of every append costs: ours once more at the first rate, on its
  // in-memory log (no Redis; Postgres still copies the log). Reported, not decided.
  let memoryLog: FanoutResult | undefined;
  if (!opts.smoke) {
    progress.say(`ours on its in-memory log (no Redis): ${rates[0]} events/s`);
    memoryLog = await runFanout('ours', { ...plan, rate: rates[0] as number, cores, memoryLog: true }, progress);
  }
  /** A system's runs at rate `i`: its first, and its second when there is one. */
  const runsOf = (s: System, i: number) =>
    [byRate[i]?.[s], againByRate[i]?.[s]].filter((r): r is FanoutResult => r !== undefined);
  /** A CPU figure of a system at a rate: the mean of its runs there. */
  const cpuMean = (s: System, i: number, f: (r: FanoutResult) => number): number | undefined => {
    const runs = runsOf(s, i);
    return runs.length ? runs.reduce((a, r) => a + f(r), 0) / runs.length : undefined;
  };
  const results = byRate[0] as Partial<Record<System, FanoutResult>>;
  const high = byRate[1] as Partial<Record<System, FanoutResult>>;
  const ours = results.ours as FanoutResult;
  const oursHigh = high.ours as FanoutResult;
  const base = (s: System, f: (r: FanoutResult) => number, at = results) => {
    const r = at[s];
    return r ? { name: label(s), value: f(r) } : undefined;
  };
  const decide = !opts.smoke;
  const lost = (r: FanoutResult) => r.expected - r.delivered;
  const deliveries = (rate: number) => (rate * deliveriesPerEvent).toLocaleString('en-US');
  const perThousand = (r: FanoutResult) => r.cpuSecondsPerThousand;
  const serverPerThousand = (r: FanoutResult) => (1000 * (r.sideCpu.parts.server ?? Number.NaN)) / r.delivered;
  /** Nchan's mean over its runs at rate `i`, as a baseline. */
  const nchanMean = (i: number, f: (r: FanoutResult) => number) => {
    const v = cpuMean('Nchan', i, f);
    return v === undefined ? undefined : { name: 'Nchan', value: round(v, 5) };
  };
  const both = decide ? ' (mean of two runs each, in the order ours, Nchan, floor, Nchan, ours)' : '';
  const cpuTarget = (i: number, atMost: number): Target => {
    const runs = runsOf('ours', i);
    const t = ratioTarget(
      `CPU s per 1,000 deliveries at ${deliveries(rates[i] as number)}/s, ours with Redis and Postgres (Nchan with its publisher)${both}`,
      's',
      round(cpuMean('ours', i, perThousand) as number, 5),
      nchanMean(i, perThousand),
      { atMost },
      decide && runs.every((r) => r.sideCpu.missing.length === 0),
    );
    const missing = runs.flatMap((r) => r.sideCpu.missing);
    if (missing.length) t.note = `not counted: ${[...new Set(missing)].join(', ')}`;
    const short = runs.filter((r) => lost(r) > 0);
    if (short.length) t.note = short.map((r) => `${lost(r)} of ${r.expected} deliveries missing`).join('; ');
    return t;
  };
  const targets: Target[] = [
    ratioTarget(
      'delivered events/s',
      'events/s',
      ours.deliveredPerSecond,
      base('Nchan', (r) => r.deliveredPerSecond),
      { atLeast: 1 },
      decide,
    ),
    ratioTarget(
      `append-to-receipt p99 (median of ${P99_WINDOWS} parts of the run)`,
      'ms',
      ours.p99Median,
      base('Nchan', (r) => r.p99Median),
      { atMost: 2 },
      decide,
    ),
    reported(
      ratioTarget(
        'append-to-receipt p99 over the whole run',
        'ms',
        ours.latency.p99 as number,
        base('Nchan', (r) => r.latency.p99 as number),
        { atMost: 2 },
      ),
      'reported',
    ),
    cpuTarget(0, CPU_TARGET_LOW),
    cpuTarget(1, CPU_TARGET_HIGH),
    ...[0, 1].map((i) =>
      reported(
        ratioTarget(
          `CPU s per 1,000 deliveries at ${deliveries(rates[i] as number)}/s, the server process alone (Nchan's nginx alone)${both}`,
          's',
          round(cpuMean('ours', i, serverPerThousand) as number, 5),
          nchanMean(i, serverPerThousand),
          { atMost: 1 },
        ),
        'reported',
      ),
    ),
    ...(memoryLog
      ? [
          reported(
            ratioTarget(
              `CPU s per 1,000 deliveries at ${deliveries(rates[0] as number)}/s, ours on its in-memory log (no Redis; its Postgres copying the log), against Nchan with its publisher (Nchan's mean)`,
              's',
              memoryLog.cpuSecondsPerThousand,
              nchanMean(0, perThousand),
              { atMost: 1 },
            ),
            'reported (what the Redis append costs)',
          ),
        ]
      : []),
    reported(
      ratioTarget(
        `append-to-receipt p99 at ${deliveries(rates[1] as number)} deliveries/s (median of ${P99_WINDOWS} parts)`,
        'ms',
        oursHigh.p99Median,
        base('Nchan', (r) => r.p99Median, high),
        { atMost: 2 },
      ),
      'reported',
    ),
    reported(
      ratioTarget(
        'delivered events/s against the floor',
        'events/s',
        ours.deliveredPerSecond,
        base('floor', (r) => r.deliveredPerSecond),
        { atLeast: 1 },
      ),
      'reported (share of the floor)',
    ),
    reported(
      ratioTarget(
        'append-to-receipt p99 against the floor',
        'ms',
        ours.p99Median,
        base('floor', (r) => r.p99Median),
        { atMost: 1 },
      ),
      'reported (multiple of the floor)',
    ),
    reported(
      ratioTarget(
        `CPU s per 1,000 deliveries at ${deliveries(rates[1] as number)}/s against the floor (with its publisher)`,
        's',
        oursHigh.cpuSecondsPerThousand,
        base('floor', (r) => r.cpuSecondsPerThousand, high),
        { atMost: 1 },
      ),
      'reported (multiple of the floor)',
    ),
  ];
  if (errors.Nchan) {
    for (const t of targets.filter((x) => x.baseline === undefined && !/floor/.test(x.what))) {
      t.note = `Nchan not measured: ${errors.Nchan}`;
    }
  }
  if (lost(ours) > 0 && targets[0]) {
    targets[0].note = `${lost(ours)} of ${ours.expected} deliveries missing`;
    if (decide) targets[0].met = false;
  }
  const runs = (Object.entries(results) as [System, FanoutResult][]).map(([s, r]) => ({
    name: label(s),
    who: who(s),
    r,
  }));
  const allRuns = [
    ...byRate.flatMap((at, i) =>
      [at, againByRate[i] ?? {}].flatMap((runsAt, k) =>
        (Object.entries(runsAt) as [System, FanoutResult][]).map(([s, r]) => ({
          name: `${label(s)} at ${deliveries(rates[i] as number)}/s${k === 1 ? ', second run' : ''}`,
          who: who(s),
          r,
        })),
      ),
    ),
    ...(memoryLog
      ? [{ name: `ours on its in-memory log at ${deliveries(rates[0] as number)}/s`, who: 'ours', r: memoryLog }]
      : []),
  ];
  return {
    figures: { plan, rates, cores, ...results, high, second: againByRate, memoryLog, errors },
    targets,
    charts: [
      {
        kind: 'bars',
        file: 'throughput',
        title: 'Delivered events per second',
        unit: 'events/s',
        bars: runs.map(({ name, who, r }) => ({ label: name, value: r.deliveredPerSecond, who })),
      },
      {
        kind: 'bars',
        file: 'cpu',
        title: 'CPU seconds per 1,000 deliveries, the whole side (stores, publisher)',
        unit: 's',
        bars: allRuns.map(({ name, who, r }) => ({ label: name, value: r.cpuSecondsPerThousand, who })),
      },
      ...latencyCharts(runs),
      {
        kind: 'bars',
        file: 'memory',
        title: 'Server memory per watcher while fanning out (RSS peak / watchers)',
        unit: 'bytes',
        bars: runs.map(({ name, who, r }) => ({ label: name, value: r.rssPeak / Math.max(1, r.held), who })),
      },
    ],
    notes: [
      ...layoutNotes,
      `Two rates in one run: ${rates.map((r) => `${r} events/s (${deliveries(r)} deliveries/s)`).join(' and ')}, each system on a fresh server (and, for ours, a fresh Redis and Postgres) at each. At each rate ours and Nchan run twice, in the order ours, Nchan, floor, Nchan, ours (once each in a smoke run): the CPU rows compare the means of each's runs, so the machine's drift over those minutes weighs on both sides; the delivered and p99 rows are the first rate's first runs.`,
      `Cores: ${cores.description}.`,
      `CPU per delivery: utime + stime from /proc/<pid>/stat of every process of each side (and their children: nginx's workers, Postgres's backends), read just before publishing starts and again once every delivery has arrived, over the deliveries that arrived. Ours: the service process (its appends run inside it), its Redis and its Postgres. Nchan: nginx (master and worker) and the publisher process POSTing the events. The floor: its process and the same publisher.`,
      `Each system first gets ${plan.warmupSeconds ?? 0} s of the same publishing, not counted: the steady state is measured.`,
      `The p99 target takes each system's p99 in each of ${P99_WINDOWS} equal parts of its run and compares their medians, so that one moment of other work on this shared two-core machine (a pause of 20 ms in one second) moves one part and not the verdict; the p99 over the whole run is reported beside it. Per part: ${runs.map(({ name, r }) => `${name} ${r.p99Windows.join(' / ')} ms`).join('; ')}.`,
      ...(ours.gc && ours.appends
        ? [
            `Where ours' tail comes from (its event loop over the measured window): garbage collection paused it ${ours.gc.pauses} times for ${ours.gc.totalMs} ms in all (longest ${ours.gc.maxMs} ms); the appends, which run inside the service, were issued p50 ${ours.appends.issueLagMs.p50} / p99 ${ours.appends.issueLagMs.p99} ms after their scheduled time (the loop's lag) and took p50 ${ours.appends.appendMs.p50} / p99 ${ours.appends.appendMs.p99} ms to Redis and back.`,
          ]
        : []),
      'Latency is from the scheduled send time in each event to its receipt, so a publisher that falls behind shows as latency. Delivered events/s counts deliveries to every watcher (until all arrived or 10 s past the end) over the publishing time.',
      ...allRuns.map(
        ({ name, r }) =>
          `${name}: ${r.delivered}/${r.expected} delivered, p99 ${r.p99Median} ms (median of parts), side CPU ${r.sideCpu.total} s (${fmtParts(r)}), ${r.cpuSecondsPerThousand} s per 1,000 deliveries; watcher processes ${r.watcherCpuSeconds} s.`,
      ),
    ],
    clientCpuSeconds: round(
      byRate.reduce((a, at) => a + Object.values(at).reduce((b, r) => b + r.clientCpuSeconds, 0), 0),
    ),
  };
}

/**
 * Fan-out: 10,000 watchers over 1,000 conversations of 10 tenants (`GET
 * /api/conversations/:id/stream?wait=true`, each tenant's bearer key), events appended at a
 * fixed rate inside our service through its write path, each carrying its scheduled send
 * time. The same layout on Nchan (1,000 channels x 10 EventSource subscribers, a publisher
 * process POSTing at the same rate over keep-alive) and on the bare uWebSockets.js floor.
 * Delivered events/s and send-to-receipt latency, per second and overall; CPU seconds per
 * thousand deliveries of each whole side, at `--rate` and at HIGH_RATE_FACTOR times it.
 */
export const sseFanout: Scenario = {
  name: 'sse-fanout',
  title:
    'sse-fanout: live fan-out to 10,000 watchers of 1,000 conversations, ours against Nchan and a bare uWebSockets.js server',
  defaults: { connections: 10_000, duration: 15, rate: 1000 },
  smoke: { connections: 300, duration: 2, rate: 100 },
  async run({ opts, progress }): Promise<Outcome> {
    const plan = fanoutPlan(opts);
    return compareFanout(
      plan,
      opts,
      progress,
      [
        `${plan.watchers} watchers over ${plan.conversations} conversations of ${plan.tenants} tenants (${PER_CONVERSATION} per conversation), events for ${plan.seconds} s at each rate, round robin over the conversations; watchers in child processes on raw sockets.`,
        'Ours: `GET /api/conversations/:id/stream?wait=true` with the tenant key; events appended inside the service process through appendEvents (one producer per conversation), on a throwaway Redis and Postgres. Nchan and the floor: `/sub/<channel>` subscribers (a channel per conversation), a publisher process POSTing `/pub/<channel>` over 16 keep-alive connections.',
      ],
      plan.watchers / plan.conversations,
    );
  },
};

/** Watchers per tenant stream and conversations per tenant of sse-tenant (1,000 / 10 tenants). */
const PER_TENANT = 100;
const CONVERSATIONS_PER_TENANT = 10;

/**
 * Team fan-out: 1,000 watchers of `GET /api/events/stream` (every conversation of the tenant),
 * 100 per tenant over 10 tenants of 10 conversations each, events appended at a fixed rate
 * round robin over the conversations: each event reaches every watcher of its tenant. The same
 * layout on Nchan and the floor with a channel per tenant. Both rates and figures as sse-fanout.
 */
export const sseTenant: Scenario = {
  name: 'sse-tenant',
  title:
    'sse-tenant: live fan-out of every conversation of a tenant to 1,000 watchers of 10 tenants, ours against Nchan',
  defaults: { connections: 1000, duration: 15, rate: 100 },
  smoke: { connections: 200, duration: 2, rate: 20 },
  async run({ opts, progress }): Promise<Outcome> {
    const tenants = Math.max(1, Math.min(MAX_TENANTS, Math.round(opts.connections / PER_TENANT)));
    const plan: FanoutPlan = {
      ...fanoutPlan(opts),
      stream: 'tenant',
      tenants,
      conversations: tenants * CONVERSATIONS_PER_TENANT,
    };
    return compareFanout(
      plan,
      opts,
      progress,
      [
        `${plan.watchers} watchers of their tenant's whole stream, ${Math.round(plan.watchers / tenants)} per tenant over ${tenants} tenants of ${CONVERSATIONS_PER_TENANT} conversations each; ${plan.rate} events/s for ${plan.seconds} s, round robin over the conversations, so each event reaches every watcher of its tenant (${Math.round(plan.watchers / tenants)} deliveries per event); watchers in child processes on raw sockets.`,
        'Ours: `GET /api/events/stream` with the tenant key (the cross-conversation stream a team dashboard follows); events appended inside the service process through appendEvents, on a throwaway Redis and Postgres. Nchan and the floor: `/sub/<channel>` subscribers with a channel per tenant, a publisher process POSTing `/pub/<channel>` over 16 keep-alive connections.',
      ],
      plan.watchers / tenants,
    );
  },
};
