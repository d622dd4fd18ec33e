/**
 * Runs our rate limiter contract suite against rate-limiter-flexible (memory and Redis), the
 * same suite our adapters pass, and prints TAP. Part of `npm run bench:ratelimit`'s answer to
 * whether the library could replace ours.
 *
 *   node --import tsx bench/src/ratelimit/contract.ts
 */
import { Redis } from 'ioredis';
import t from 'tap';
import { rateLimiterContract } from '../../../gateway/src/ratelimit/ratelimit.contract.ts';
import { startRedis } from '../lib/redis.ts';
import { flexibleMemoryLimiter, flexibleRedisLimiter } from './flexible.ts';

t.test('rate-limiter-flexible, memory', async (t) => rateLimiterContract(t, flexibleMemoryLimiter));

t.test('rate-limiter-flexible, Redis', async (t) => {
  const server = await startRedis();
  const redis = new Redis(server.url);
  t.teardown(async () => {
    redis.disconnect();
    await server.stop();
  });
  rateLimiterContract(t, (o) => flexibleRedisLimiter(redis, o, 'contract'));
});
