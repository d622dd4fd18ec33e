import { startPostgres } from '../lib/postgres.ts';
import { startRedis } from '../lib/redis.ts';
import { absoluteTarget, type Outcome, ratioTarget, type Scenario, type Target } from '../lib/scenario.ts';
import { type FanoutResult, mib, runFanout } from '../sse/fanout.ts';
import { fanoutPlan, latencyCharts } from './sse-fanout.ts';

/** The share of watchers that stop reading. */
const SLOW_SHARE = 0.05;
/** What the gateway may buffer for one watcher before it cuts it off (SSE_MAX_BUFFER_BYTES). */
const MAX_BUFFER = 256 * 1024;
/** Filler per event, so a paused watcher falls megabytes behind within the run. */
const PADDING = 2048;
/** Room for what else the run allocates (the slow watchers' own state, GC timing). */
const SLACK = 64 * 2 ** 20;

/**
 * sse-fanout with 5% of watchers that stop reading, against the same run without them. The
 * slow watchers follow their tenant's whole stream (`/api/events/stream`, a tenth of all
 * events) and pause their sockets once held; events carry filler so each falls behind by
 * megabytes: a paused loopback socket absorbs about 4 MB in kernel buffers before the
 * gateway sees backpressure, and only then does SSE_MAX_BUFFER_BYTES apply. Healthy watchers'
 * latency must stay within 1.2x of the run without slow ones, and the gateway's memory under
 * what its buffer bound allows.
 */
export const slowWatcher: Scenario = {
  name: 'slow-watcher',
  title: 'slow-watcher: sse-fanout with 5% of watchers that stop reading, against the same run without them',
  defaults: { connections: 10_000, duration: 30, rate: 1000 },
  smoke: { connections: 300, duration: 1, rate: 100 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const slow = Math.max(1, Math.round(opts.connections * SLOW_SHARE));
    // One Redis and one Postgres for both runs (each run has its own accounts and key prefix).
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    let redis = opts.redis;
    if (!redis) {
      const r = await startRedis();
      defer(() => r.stop());
      redis = r.url;
    }
    const plan = {
      ...fanoutPlan({ ...opts, connections: opts.connections - slow, redis }),
      postgres: pg.url,
      padding: PADDING,
      config: { SSE_MAX_BUFFER_BYTES: String(MAX_BUFFER) },
    };
    progress.say(`without slow watchers: ${plan.watchers} watchers`);
    const without = await runFanout('ours', plan, progress);
    progress.say(`with ${slow} slow watchers besides the ${plan.watchers}`);
    const withSlow = await runFanout('ours', { ...plan, slow }, progress);

    const decide = !opts.smoke;
    const bound = without.rssPeak + slow * MAX_BUFFER + SLACK;
    const perSlowBytes = (plan.rate / plan.tenants) * plan.seconds * (PADDING + 300);
    const targets: Target[] = [
      ratioTarget(
        "healthy watchers' p99 with slow watchers",
        'ms',
        withSlow.latency.p99 as number,
        { name: 'the same run without them', value: without.latency.p99 as number },
        { atMost: 1.2 },
        decide,
      ),
      absoluteTarget(
        'gateway RSS peak with slow watchers',
        'MiB',
        withSlow.rssPeak / 2 ** 20,
        {
          atMost: Math.round(bound / 2 ** 20),
        },
        decide,
      ),
      ratioTarget(
        'deliveries to healthy watchers with slow watchers',
        'events',
        withSlow.delivered,
        { name: 'the same run without them', value: without.delivered },
        { atLeast: 1 },
        decide,
      ),
    ];
    const runs = [
      { name: 'without slow watchers', who: 'baseline', r: without },
      { name: `with ${slow} slow`, who: 'ours', r: withSlow },
    ];
    return {
      figures: { plan, slow, maxBufferBytes: MAX_BUFFER, boundBytes: bound, without, withSlow },
      targets,
      charts: [
        ...latencyCharts(runs),
        {
          kind: 'bars',
          file: 'memory',
          title: 'Gateway RSS',
          unit: 'MiB',
          bars: runs.flatMap(({ name, who, r }: { name: string; who: string; r: FanoutResult }) => [
            { label: `before, ${name}`, value: r.rssBefore / 2 ** 20, who },
            { label: `peak, ${name}`, value: r.rssPeak / 2 ** 20, who },
          ]),
        },
      ],
      notes: [
        `${plan.watchers} healthy watchers over ${plan.conversations} conversations of ${plan.tenants} tenants as in sse-fanout, ${plan.rate} events/s for ${plan.seconds} s, each event with ${PADDING} bytes of filler; our service on a throwaway Redis and Postgres, SSE_MAX_BUFFER_BYTES=${MAX_BUFFER}.`,
        `With slow watchers: ${slow} more watchers of \`/api/events/stream\` (spread over the tenants) that pause their sockets once held; each is sent about ${mib(perSlowBytes)} MiB over the run. The gateway cut ${withSlow.slowClosed} of ${withSlow.slowHeld} (counted when they read again at the end).`,
        `Memory bound: the run without slow watchers' RSS peak (${mib(without.rssPeak)} MiB) + ${slow} x SSE_MAX_BUFFER_BYTES + ${mib(SLACK)} MiB slack = ${mib(bound)} MiB.`,
      ],
      clientCpuSeconds: without.clientCpuSeconds + withSlow.clientCpuSeconds,
    };
  },
};
