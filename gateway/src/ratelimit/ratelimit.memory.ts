import { type RateDecision, type RateLimiter, type RateLimitOptions, retryAfterSeconds } from './ratelimit.ts';

/** One process's buckets, for the embedded default and single-node deployments. */
export function memoryRateLimiter(options: RateLimitOptions, now: () => number = Date.now): RateLimiter {
  const buckets = new Map<string, { tokens: number; at: number }>();
  const perMs = options.perMinute / 60_000;
  const fullAfterMs = options.burst / perMs;
  let sweptAt = now();

  return {
    take(key: string): RateDecision {
      const t = now();
      if (t - sweptAt > fullAfterMs) {
        // Forget buckets that have refilled completely; they are equal to a new one.
        for (const [k, b] of buckets) if (t - b.at >= fullAfterMs) buckets.delete(k);
        sweptAt = t;
      }
      const b = buckets.get(key) ?? { tokens: options.burst, at: t };
      b.tokens = Math.min(options.burst, b.tokens + (t - b.at) * perMs);
      b.at = t;
      buckets.set(key, b);
      if (b.tokens >= 1) {
        b.tokens -= 1;
        return { allowed: true, retryAfterS: 0 };
      }
      return { allowed: false, retryAfterS: retryAfterSeconds(b.tokens, options.perMinute) };
    },
  };
}
