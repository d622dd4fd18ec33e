import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { startTestService } from './harness.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function haveRedis(): boolean {
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** A redis-server of this test's own, so stopping it disturbs nobody else. */
function ownRedis(port: number, dir: string): ChildProcess {
  return spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--maxmemory-policy', 'noeviction'],
    { stdio: 'ignore' },
  );
}

async function waitUp(port: number) {
  for (let i = 0; i < 100; i++) {
    try {
      execFileSync('redis-cli', ['-p', String(port), 'ping'], { stdio: 'pipe' });
      return;
    } catch {
      await sleep(50);
    }
  }
  throw new Error('redis did not come up');
}

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
    const port = 21000 + Math.floor(Math.random() * 20000);
    const dir = mkdtempSync(join(tmpdir(), 'svc-ready-redis-'));
    let redis = ownRedis(port, dir);
    t.teardown(() => {
      redis.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    });
    await waitUp(port);
    const svc = await startTestService(t, {
      backend: 'postgres+redis',
      env: { REDIS_URL: `redis://127.0.0.1:${port}` },
    });
    const up = await svc.http.get('/api/ready');
    t.equal(up.status, 200);
    t.same(up.body, { status: 'ready', checks: { database: 'ok', redis: 'ok', migrations: 'ok' } });

    const exited = new Promise((r) => redis.once('exit', r));
    redis.kill('SIGKILL');
    await exited;
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

    redis = ownRedis(port, dir);
    await waitUp(port);
    let back = await svc.http.get('/api/ready');
    for (let i = 0; i < 100 && back.status !== 200; i++) {
      await sleep(100);
      back = await svc.http.get('/api/ready');
    }
    t.equal(back.status, 200, 'ready again');
    t.equal(back.body.checks.redis, 'ok');
  },
);
