import type { Test } from 'tap';
import type { RateLimiter, RateLimitOptions } from './ratelimit.ts';

/**
 * What every RateLimiter adapter must do (CONVENTIONS 1). `make` builds a fresh limiter with
 * the given options; keys are unique per run so adapters sharing a store do not interfere.
 */
export function rateLimiterContract(t: Test, make: (o: RateLimitOptions) => Promise<RateLimiter> | RateLimiter) {
  const run = Math.random().toString(36).slice(2);

  t.test('a bucket allows its burst, then refuses with a whole-second Retry-After', async (t) => {
    const limiter = await make({ perMinute: 60, burst: 3 });
    const key = `${run}-burst`;
    for (let i = 0; i < 3; i++) t.equal((await limiter.take(key)).allowed, true, `request ${i + 1} allowed`);
    const refused = await limiter.take(key);
    t.equal(refused.allowed, false, 'the fourth is refused');
    t.ok(
      Number.isInteger(refused.retryAfterS) && refused.retryAfterS >= 1 && refused.retryAfterS <= 1,
      `retry after ${refused.retryAfterS}s`,
    );
  });

  t.test('buckets are per key', async (t) => {
    const limiter = await make({ perMinute: 60, burst: 1 });
    t.equal((await limiter.take(`${run}-a`)).allowed, true);
    t.equal((await limiter.take(`${run}-a`)).allowed, false);
    t.equal((await limiter.take(`${run}-b`)).allowed, true, 'another key has its own bucket');
  });

  t.test('tokens come back at the configured rate', async (t) => {
    // One token every second: the second take must come within it, which a loaded machine
    // stalling a few tens of ms between two calls must not decide (it did at 50 ms).
    const limiter = await make({ perMinute: 60, burst: 1 });
    const key = `${run}-refill`;
    t.equal((await limiter.take(key)).allowed, true);
    t.equal((await limiter.take(key)).allowed, false);
    await new Promise((r) => setTimeout(r, 1100));
    t.equal((await limiter.take(key)).allowed, true, 'a token is back after the refill interval');
  });
}
