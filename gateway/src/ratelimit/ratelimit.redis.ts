import type { Cluster, Redis } from 'ioredis';
import { type RateDecision, type RateLimiter, type RateLimitOptions, retryAfterSeconds } from './ratelimit.ts';

// Token bucket in one script: the bucket is a hash {t: tokens, at: ms}; time comes from the
// Redis server so every node agrees. Returns {allowed, tokens*1000}.
const TAKE = `
local burst = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])
local now = redis.call('TIME')
local t = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(b[1])
local at = tonumber(b[2])
if tokens == nil then tokens = burst; at = t end
tokens = math.min(burst, tokens + (t - at) * per_ms)
local allowed = 0
if tokens >= 1 then tokens = tokens - 1; allowed = 1 end
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'at', t)
redis.call('PEXPIRE', KEYS[1], ttl_ms)
return {allowed, math.floor(tokens * 1000)}
`;

/**
 * Buckets in Redis, shared by every node of the fleet. One round trip per request. The script
 * touches one key, so on a Redis Cluster it runs on the shard that owns that key's slot.
 */
export function redisRateLimiter(redis: Redis | Cluster, options: RateLimitOptions, keyPrefix = ''): RateLimiter {
  const perMs = options.perMinute / 60_000;
  const ttlMs = Math.ceil(options.burst / perMs) + 1000;
  redis.defineCommand('svcRateTake', { numberOfKeys: 1, lua: TAKE });
  const take = (redis as unknown as Record<string, (...a: unknown[]) => Promise<[number, number]>>).svcRateTake as (
    ...a: unknown[]
  ) => Promise<[number, number]>;
  return {
    async take(key: string): Promise<RateDecision> {
      const [allowed, milliTokens] = await take.call(redis, `${keyPrefix}rl:{${key}}`, options.burst, perMs, ttlMs);
      if (allowed === 1) return { allowed: true, retryAfterS: 0 };
      return { allowed: false, retryAfterS: retryAfterSeconds(milliTokens / 1000, options.perMinute) };
    },
  };
}
