/**
 * rate-limiter-flexible behind our RateLimiter port, so the bench and the contract suite can
 * put it beside our adapters. The library counts fixed windows, not a token bucket: the
 * nearest mapping of a bucket (`burst` tokens, `perMinute` refill) is `burst` points per
 * window of `burst / perMinute` minutes.
 */
import type { Redis } from 'ioredis';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { RateDecision, RateLimiter, RateLimitOptions } from '../../../gateway/src/ratelimit/ratelimit.ts';

type Consumer = { consume(key: string, points?: number): Promise<RateLimiterRes> };

const allowed: RateDecision = { allowed: true, retryAfterS: 0 };

function adapt(limiter: Consumer): RateLimiter {
  return {
    take: (key) =>
      limiter.consume(key).then(
        () => allowed,
        // The library rejects with its result when the window is used up, with an Error when the store fails.
        (refused: unknown) => {
          if (!(refused instanceof RateLimiterRes)) throw refused;
          return { allowed: false, retryAfterS: Math.max(1, Math.ceil(refused.msBeforeNext / 1000)) };
        },
      ),
  };
}

const windowS = (o: RateLimitOptions) => (o.burst * 60) / o.perMinute;

export function flexibleMemoryLimiter(o: RateLimitOptions): RateLimiter {
  return adapt(new RateLimiterMemory({ points: o.burst, duration: windowS(o) }));
}

export function flexibleRedisLimiter(redis: Redis, o: RateLimitOptions, keyPrefix: string): RateLimiter {
  return adapt(new RateLimiterRedis({ storeClient: redis, points: o.burst, duration: windowS(o), keyPrefix }));
}
