import t from 'tap';
import { startTestService } from './harness.ts';
import { haveRedis, ownRedisServer } from './own-redis.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('on the embedded defaults, ready names Redis not_configured', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded' });
  const res = await svc.http.get('/api/ready');
  t.equal(res.status, 200);
  t.same(res.body, { status: 'ready', checks: { database: 'ok', redis: 'not_configured', migrations: 'ok' } });
});

t.test('a migration not applied makes the service not ready, naming migrations', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded' });
  const [last] = await svc.db.sql<{ name: string }[]>`SELECT name FROM schema_migrations ORDER BY name DESC LIMIT 1`;
  await svc.db.sql`DELETE FROM schema_migrations WHERE name = ${last?.name as string}`;
  const res = await svc.http.get('/api/ready');
  t.equal(res.status, 503);
  t.equal(res.headers.get('retry-after'), '1');
  t.match(res.body, {
    error: 'not_ready',
    message: /migrations pending/,
    status: 'not_ready',
    checks: { database: 'ok', migrations: 'pending' },
  });
});

t.test(
  'Redis stopped: 503 naming redis, with Retry-After; ready again once it is back',
  {
    skip: !haveRedis() && 'no redis-server',
  },
  async (t) => {
    const redis = await ownRedisServer(t, 'ready-redis');
    const svc = await startTestService(t, {
      backend: 'postgres+redis',
      env: { REDIS_URL: `redis://127.0.0.1:${redis.port}` },
    });
    const up = await svc.http.get('/api/ready');
    t.equal(up.status, 200);
    t.same(up.body, { status: 'ready', checks: { database: 'ok', redis: 'ok', migrations: 'ok' } });

    await redis.stop('SIGKILL');
    const down = await svc.http.get('/api/ready');
    t.equal(down.status, 503);
    t.equal(down.headers.get('retry-after'), '1');
    t.same(down.body, {
      error: 'not_ready',
      message: 'Not ready: redis unreachable.',
      status: 'not_ready',
      checks: { database: 'ok', redis: 'unreachable', migrations: 'ok' },
    });
    const alive = await svc.http.get('/api/health');
    t.equal(alive.status, 200, 'liveness is not readiness: the process still answers');

    await redis.start();
    let back = await svc.http.get('/api/ready');
    for (let i = 0; i < 100 && back.status !== 200; i++) {
      await sleep(100);
      back = await svc.http.get('/api/ready');
    }
    t.equal(back.status, 200, 'ready again');
    t.equal(back.body.checks.redis, 'ok');
  },
);
