import { Redis } from 'ioredis';
import t from 'tap';
import { rateLimiterContract } from '../../gateway/src/ratelimit/ratelimit.contract.ts';
import { memoryRateLimiter } from '../../gateway/src/ratelimit/ratelimit.memory.ts';
import { redisRateLimiter } from '../../gateway/src/ratelimit/ratelimit.redis.ts';
import { startTestService } from './harness.ts';

t.test('memory rate limiter contract', async (t) => rateLimiterContract(t, (o) => memoryRateLimiter(o)));

t.test('redis rate limiter contract', { skip: !process.env.TEST_REDIS_URL && 'no TEST_REDIS_URL' }, async (t) => {
  const redis = new Redis(process.env.TEST_REDIS_URL as string);
  t.teardown(() => redis.quit());
  rateLimiterContract(t, (o) => redisRateLimiter(redis, o, 'contract:'));
});

for (const edge of [true, false]) {
  t.test(
    `${edge ? 'the edge' : 'the api role alone (EDGE=false)'} limits every /api request per client IP, authenticated or not, streams included`,
    async (t) => {
      // Burst 5: the harness reads /api/openapi.json once at start, leaving 4.
      const svc = await startTestService(t, {
        backend: 'embedded',
        env: { RATE_LIMIT_PER_MINUTE: '5', EDGE: String(edge) },
      });
      const statuses: number[] = [];
      for (let i = 0; i < 3; i++) statuses.push((await fetch(`${svc.url}/api/auth/me`)).status);
      const stream = await fetch(`${svc.url}/api/events/stream`);
      statuses.push(stream.status);
      t.same(statuses, [401, 401, 401, 401], 'the burst passes (unauthenticated requests and stream openings count)');
      const limited = await fetch(`${svc.url}/api/auth/me`, { headers: { authorization: 'Bearer svc_whatever' } });
      t.equal(limited.status, 429);
      t.ok(Number(limited.headers.get('retry-after')) >= 1, `Retry-After: ${limited.headers.get('retry-after')}`);
      t.same(await limited.json(), { error: 'rate_limited', message: 'Too many requests; retry later.' });
      const limitedStream = await fetch(`${svc.url}/api/team/stream`);
      t.equal(limitedStream.status, 429, 'a stream opening beyond the burst is refused too');
      t.same(await limitedStream.json(), { error: 'rate_limited', message: 'Too many requests; retry later.' });
      const outside = await fetch(`${svc.url}/llms.txt`);
      t.equal(outside.status, 200, 'paths outside /api are not limited');
    },
  );
}

t.test('RATE_LIMIT_EXEMPT lets listed networks through', async (t) => {
  const svc = await startTestService(t, {
    backend: 'embedded',
    env: { RATE_LIMIT_PER_MINUTE: '1', RATE_LIMIT_EXEMPT: '10.0.0.0/8,127.0.0.0/8' },
  });
  for (let i = 0; i < 5; i++) t.equal((await fetch(`${svc.url}/api/openapi.json`)).status, 200);
});

t.test(
  'with Redis, nodes share one bucket per client IP',
  { skip: !process.env.TEST_REDIS_URL && 'no TEST_REDIS_URL' },
  async (t) => {
    const prefix = `shared${Math.random().toString(36).slice(2, 8)}:`;
    // Burst 8: each node's harness reads /api/openapi.json once at start, leaving 6.
    const env = { RATE_LIMIT_PER_MINUTE: '8', REDIS_KEY_PREFIX: prefix };
    const a = await startTestService(t, { backend: 'postgres+redis', env });
    const b = await startTestService(t, { backend: 'postgres+redis', env });
    const seen: number[] = [];
    for (let i = 0; i < 3; i++) {
      seen.push((await fetch(`${a.url}/api/openapi.json`)).status);
      seen.push((await fetch(`${b.url}/api/openapi.json`)).status);
    }
    t.same(seen, [200, 200, 200, 200, 200, 200], 'six requests spread over two nodes pass');
    t.equal((await fetch(`${a.url}/api/openapi.json`)).status, 429, 'the seventh is refused on node a');
    t.equal((await fetch(`${b.url}/api/openapi.json`)).status, 429, 'and on node b');
  },
);
