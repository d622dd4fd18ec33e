import { type Outcome, ratioTarget, type Scenario } from '../lib/scenario.ts';
import { round } from '../lib/stats.ts';
import { type FanoutResult, runFanout, sharedStores } from '../sse/fanout.ts';
import { fanoutPlan } from './sse-fanout.ts';

/** The publishing rates tried, as multiples of `--rate`, until a system does not keep up. */
const STEPS = [1, 2, 3, 4, 6, 8, 12, 16];
/** A smoke run tries the first two. */
const SMOKE_STEPS = 2;
/** Past this p99 (median of the run's parts) a system is no longer delivering live. */
const LIVE_P99_MS = 50;

type Peer = 'ours' | 'Nchan';

interface Step {
  rate: number;
  /** Deliveries a second the rate asks for (rate x watchers per conversation). */
  asked: number;
  result: FanoutResult;
  /** Every delivery arrived and p99 stayed live. */
  kept: boolean;
}

/**
 * How far the fan-out goes: the sse-fanout layout (10,000 watchers over 1,000 conversations)
 * at `--rate`, then 2, 3, 4, 6, 8, 12 and 16 times it, until a system no longer keeps up (a delivery
 * missing 10 s after publishing ended, or p99 past 50 ms), on ours and on Nchan. The ceiling
 * is the highest rate kept, in deliveries a second. Nothing is decided: sse-fanout holds the
 * issue's bar; this reports how far past it each system goes on this machine, where the load
 * clients share the two cores (their CPU is in the notes).
 */
export const sseCeiling: Scenario = {
  name: 'sse-ceiling',
  title:
    'sse-ceiling: the sse-fanout layout at rising rates, the highest each system delivers live, ours against Nchan',
  defaults: { connections: 10_000, duration: 10, rate: 1000 },
  smoke: { connections: 200, duration: 1, rate: 50 },
  async run(ctx): Promise<Outcome> {
    const { opts, progress } = ctx;
    const { redis, postgres } = await sharedStores(ctx);
    const steps = opts.smoke ? STEPS.slice(0, SMOKE_STEPS) : STEPS;
    // A smoke run's first seconds are a cold process's: only whether deliveries arrive counts.
    const liveP99 = opts.smoke ? Number.POSITIVE_INFINITY : LIVE_P99_MS;
    const ladders: Record<Peer, Step[]> = { ours: [], Nchan: [] };
    const errors: Partial<Record<Peer, string>> = {};
    for (const system of ['ours', 'Nchan'] as const) {
      for (const k of steps) {
        // sse-fanout's plan, its warm-up included, at this rate.
        const plan = { ...fanoutPlan({ ...opts, rate: opts.rate * k, redis }), postgres };
        const perConversation = plan.watchers / plan.conversations;
        progress.say(`${system}: ${plan.rate} events/s (${plan.rate * perConversation} deliveries/s)`);
        let result: FanoutResult;
        try {
          result = await runFanout(system, plan, progress);
        } catch (err) {
          if (system === 'ours') throw err;
          errors[system] = (err as Error).message;
          progress.say(`${system} not measured: ${errors[system]}`);
          break;
        }
        const kept = result.delivered >= result.expected && result.publishFailed === 0 && result.p99Median <= liveP99;
        ladders[system].push({ rate: plan.rate, asked: plan.rate * perConversation, result, kept });
        if (!kept) break;
      }
    }
    const ceiling = (s: Peer) => Math.max(0, ...ladders[s].filter((x) => x.kept).map((x) => x.asked));
    const top = (s: Peer) => ladders[s].length === steps.length && (ladders[s].at(-1) as Step).kept;
    const of = (s: Peer) =>
      ladders[s].length === 0 ? undefined : { name: `${s}${top(s) ? ', every rate tried' : ''}`, value: ceiling(s) };
    const target = {
      ...ratioTarget(
        `deliveries/s kept live (all delivered, p99 <= ${LIVE_P99_MS} ms)`,
        'deliveries/s',
        ceiling('ours'),
        of('Nchan'),
        { atLeast: 1 },
        false,
      ),
      goal: 'reported (the ceiling)',
    };
    if (top('ours')) target.note = `ours kept every rate tried: its ceiling is above ${ceiling('ours')}`;
    const row = (s: Peer, x: Step) =>
      `${s} at ${x.rate} events/s (${x.asked} deliveries/s): ${x.result.delivered}/${x.result.expected} delivered, p50 ${x.result.latency.p50} ms, p99 ${x.result.p99Median} ms (median of parts; whole run ${x.result.latency.p99}), server CPU ${x.result.serverCpuSeconds} s, clients ${x.result.clientCpuSeconds} s: ${x.kept ? 'kept' : 'not kept'}.`;
    return {
      figures: {
        steps,
        liveP99Ms: liveP99,
        ceilings: { ours: ceiling('ours'), Nchan: ceiling('Nchan') },
        ladders,
        errors,
      },
      targets: [target],
      charts: [
        {
          kind: 'bars',
          file: 'ceiling',
          title: 'Deliveries per second kept live',
          unit: 'deliveries/s',
          bars: (['ours', 'Nchan'] as const).map((s) => ({ label: s, value: ceiling(s), who: s })),
        },
        {
          kind: 'lines',
          file: 'p99',
          title: 'Append-to-receipt p99 (median of parts) by deliveries asked',
          unit: 'ms',
          xLabel: 'deliveries per second asked',
          series: (['ours', 'Nchan'] as const).map((s) => ({
            name: s,
            points: ladders[s].map((x) => [x.asked, x.result.p99Median] as const),
          })),
        },
      ],
      notes: [
        `The sse-fanout layout (${opts.connections} watchers, ${fanoutPlan(opts).conversations} conversations of ${fanoutPlan(opts).tenants} tenants), published at ${steps.map((k) => opts.rate * k).join(', ')} events/s, ${opts.duration} s each after ${fanoutPlan(opts).warmupSeconds} s of warm-up; each system stops at the first rate it does not keep (a delivery missing 10 s after the end, or p99 over ${LIVE_P99_MS} ms). Every rate runs on a fresh server; ours on one Redis and one Postgres for all its runs.`,
        "The load clients (watcher processes, and the publisher process for Nchan) share the two cores with the server, so a ceiling here is this machine's, not the server's alone: their CPU seconds are given per rate.",
        ...(['ours', 'Nchan'] as const).flatMap((s) => ladders[s].map((x) => row(s, x))),
        ...Object.entries(errors).map(([s, e]) => `${s} not measured: ${e}`),
        `Ceiling: ours ${round(ceiling('ours'))}, Nchan ${round(ceiling('Nchan'))} deliveries/s.`,
      ],
      clientCpuSeconds: round(
        (['ours', 'Nchan'] as const).reduce(
          (a, s) => a + ladders[s].reduce((b, x) => b + x.result.clientCpuSeconds, 0),
          0,
        ),
      ),
    };
  },
};
