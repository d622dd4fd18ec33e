/**
 * Our rate limiter against rate-limiter-flexible, memory and Redis, in the same run: take()
 * calls per second and per-call latency (p50, p99) over the same key spread, against a
 * throwaway Redis this script starts. Each pair runs in the order ours, theirs, theirs, ours,
 * so drift over the run weighs on both alike; figures are over both runs of a pair. Prints a
 * table.
 *
 *   npm run bench:ratelimit -- [--calls 200000] [--keys 1000] [--concurrency 32]
 *
 * Limits are the service's defaults (600 a minute, burst 600), so a key at this spread is
 * never refused: what is measured is the cost of the common, allowed request.
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { memoryRateLimiter } from '../../../gateway/src/ratelimit/ratelimit.memory.ts';
import { redisRateLimiter } from '../../../gateway/src/ratelimit/ratelimit.redis.ts';
import type { RateLimiter, RateLimitOptions } from '../../../gateway/src/ratelimit/ratelimit.ts';
import { startRedis } from '../lib/redis.ts';
import { percentiles, round } from '../lib/stats.ts';
import { flexibleMemoryLimiter, flexibleRedisLimiter } from './flexible.ts';

const { values } = parseArgs({
  options: {
    calls: { type: 'string', default: '200000' },
    keys: { type: 'string', default: '1000' },
    concurrency: { type: 'string', default: '32' },
  },
});
const calls = Number(values.calls);
const concurrency = Number(values.concurrency);
const limits: RateLimitOptions = { perMinute: 600, burst: 600 };
/** Client addresses, as the edge keys buckets; call i uses key i mod the spread. */
const keys = Array.from(
  { length: Number(values.keys) },
  (_, i) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`,
);

interface Run {
  seconds: number;
  latenciesMs: number[];
}

/** `n` take() calls, `inFlight` at a time, each timed from call to answer. */
async function measure(limiter: RateLimiter, n: number, inFlight: number): Promise<Run> {
  const latenciesMs = new Array<number>(n);
  let next = 0;
  let refused = 0;
  const worker = async () => {
    for (let i = next++; i < n; i = next++) {
      const start = performance.now();
      const d = await limiter.take(keys[i % keys.length] as string);
      latenciesMs[i] = performance.now() - start;
      if (!d.allowed) refused++;
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: inFlight }, worker));
  const seconds = (performance.now() - start) / 1000;
  if (refused) throw new Error(`${refused} calls refused: the bench measures allowed calls only`);
  return { seconds, latenciesMs };
}

interface Row {
  what: string;
  callsPerS: number;
  p50: number;
  p99: number;
}

/** ours, theirs, theirs, ours; each with a fresh limiter, after a warm-up of each. */
async function pair(
  label: string,
  ours: () => RateLimiter,
  theirs: () => RateLimiter,
  n: number,
  inFlight: number,
): Promise<Row[]> {
  await measure(ours(), Math.min(n, 20_000), inFlight);
  await measure(theirs(), Math.min(n, 20_000), inFlight);
  const runs: Record<'ours' | 'theirs', Run[]> = { ours: [], theirs: [] };
  for (const who of ['ours', 'theirs', 'theirs', 'ours'] as const)
    runs[who].push(await measure(who === 'ours' ? ours() : theirs(), n, inFlight));
  return (['ours', 'theirs'] as const).map((who) => {
    const rs = runs[who];
    const p = percentiles(
      rs.flatMap((r) => r.latenciesMs),
      [50, 99],
    );
    return {
      what: `${label}, ${who === 'ours' ? 'ours' : 'rate-limiter-flexible'}`,
      callsPerS: Math.round((n * rs.length) / rs.reduce((a, r) => a + r.seconds, 0)),
      p50: round((p.p50 as number) * 1000, 1),
      p99: round((p.p99 as number) * 1000, 1),
    };
  });
}

const rows: Row[] = [];
rows.push(
  ...(await pair(
    'memory',
    () => memoryRateLimiter(limits),
    () => flexibleMemoryLimiter(limits),
    calls,
    1,
  )),
);

const server = await startRedis();
const redis = new Redis(server.url);
try {
  let run = 0;
  const redisCalls = Math.min(calls, 100_000);
  rows.push(
    ...(await pair(
      `Redis, ${concurrency} in flight`,
      () => redisRateLimiter(redis, limits, `ours${run++}:`),
      () => flexibleRedisLimiter(redis, limits, `theirs${run++}`),
      redisCalls,
      concurrency,
    )),
  );
  rows.push(
    ...(await pair(
      'Redis, one at a time',
      () => redisRateLimiter(redis, limits, `ours${run++}:`),
      () => flexibleRedisLimiter(redis, limits, `theirs${run++}`),
      Math.min(redisCalls, 20_000),
      1,
    )),
  );
} finally {
  redis.disconnect();
  await server.stop();
}

console.log(`${calls} calls over ${keys.length} keys (Redis: at most 100,000), limits ${JSON.stringify(limits)}\n`);
console.log('| what | take() calls/s | p50 µs | p99 µs |');
console.log('|---|---|---|---|');
for (const r of rows) console.log(`| ${r.what} | ${r.callsPerS.toLocaleString('en')} | ${r.p50} | ${r.p99} |`);
