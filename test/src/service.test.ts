import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { migrate, openDatabase } from '@svc/db';
import { loadConfig } from '@svc/gateway';
import postgres from 'postgres';
import { SMTPServer } from 'smtp-server';
import t from 'tap';
import { startFakeProvider } from './fakes/inference-provider.ts';
import { PASSWORD, signUp, startTestService, uniqueEmail } from './harness.ts';

t.test('configuration is validated at start and a bad value names the variable', async (t) => {
  t.throws(() => loadConfig({ PORT: 'eighty' }), /PORT/);
  t.throws(() => loadConfig({ MAIL_TRANSPORT: 'pigeon' }), /MAIL_TRANSPORT/);
  t.throws(() => loadConfig({ MAIL_TRANSPORT: 'smtp' }), /SMTP_URL/);
  t.throws(() => loadConfig({ OAUTH_CLIENTS: '{not json' }), /OAUTH_CLIENTS/);
  t.throws(() => loadConfig({ OAUTH_CLIENTS: '{"a": ["not a url"]}' }), /OAUTH_CLIENTS/);
  t.throws(() => loadConfig({ MASTER_KEY: 'short' }), /MASTER_KEY/);
  t.throws(() => loadConfig({ RATE_LIMIT_PER_MINUTE: '-1' }), /RATE_LIMIT_PER_MINUTE/);
  const c = loadConfig({});
  t.equal(c.PORT, 8080);
  t.equal(c.HOST, '127.0.0.1');
  t.equal(c.DATA_DIR, '.data');
  t.equal(c.RATE_LIMIT_PER_MINUTE, 600);
  t.same(loadConfig({ API_CORS_ORIGINS: 'https://a.example, https://b.example' }).API_CORS_ORIGINS, [
    'https://a.example',
    'https://b.example',
  ]);

  const child = spawn(process.execPath, ['gateway/start.mjs'], {
    env: { ...process.env, PORT: 'eighty', DATABASE_URL: 'memory' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr += d;
  });
  const code = await new Promise((r) => child.on('close', r));
  t.equal(code, 78, 'npm start exits with EX_CONFIG');
  t.match(stderr, /PORT: /, 'the message names the variable');
});

t.test(
  'two processes migrating at once do not race',
  { skip: !process.env.TEST_DATABASE_URL && 'no Postgres' },
  async (t) => {
    const admin = process.env.TEST_DATABASE_URL as string;
    const name = `svc_migrate_${randomBytes(4).toString('hex')}`;
    const s = postgres(admin, { max: 1, onnotice: () => {} });
    await s.unsafe(`CREATE DATABASE ${name}`);
    t.teardown(async () => {
      await s.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await s.end();
    });
    const url = new URL(admin);
    url.pathname = `/${name}`;
    const a = await openDatabase({ url: url.toString(), dataDir: '/tmp' });
    const b = await openDatabase({ url: url.toString(), dataDir: '/tmp' });
    t.teardown(async () => {
      await a.close();
      await b.close();
    });
    const [ra, rb] = await Promise.all([migrate(a.sql), migrate(b.sql)]);
    t.ok(ra.length > 0 || rb.length > 0, 'one of them applied the migrations');
    t.equal(ra.length * rb.length, 0, 'the other found nothing left to do');
    const rows = await a.sql<{ name: string }[]>`SELECT name FROM schema_migrations`;
    t.equal(rows.length, ra.length + rb.length, 'each migration recorded once');
    t.same(await migrate(a.sql), [], 'a later start applies nothing');
  },
);

t.test('the embedded database keeps accounts across a restart', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded', env: { DATABASE_URL: '' } });
  const user = await signUp(svc);
  const dataDir = svc.dataDir;
  await svc.close();
  const again = await startTestService(t, {
    backend: 'embedded',
    env: { DATABASE_URL: '', DATA_DIR: dataDir, MASTER_KEY: svc.config.MASTER_KEY as string },
  });
  const me = await again.http.get('/api/auth/me', { token: user.key });
  t.equal(me.status, 200);
  t.equal(me.body.email, user.email);
});

t.test('SMTP transport sends real mail through an SMTP server', async (t) => {
  const received: { to: string; raw: string }[] = [];
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS', 'AUTH'],
    logger: false,
    onData(stream, session, done) {
      let raw = '';
      stream.on('data', (d) => {
        raw += d;
      });
      stream.on('end', () => {
        received.push({ to: session.envelope.rcptTo.map((r) => r.address).join(','), raw });
        done();
      });
    },
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const port = (server.server.address() as { port: number }).port;
  const svc = await startTestService(t, {
    backend: 'embedded',
    env: { MAIL_TRANSPORT: 'smtp', SMTP_URL: `smtp://127.0.0.1:${port}`, MAIL_FROM: 'svc <svc@test.local>' },
  });
  const email = uniqueEmail('smtp');
  await svc.http.post('/api/auth/register', { body: { email, password: PASSWORD } });
  for (let i = 0; i < 100 && received.length === 0; i++) await new Promise((r) => setTimeout(r, 50));
  t.equal(received.length, 1);
  t.equal(received[0]?.to, email);
  t.match(received[0]?.raw, /Subject: Verify your email address/);
  t.match(received[0]?.raw, /token=/);
});

t.test('CORS: only API_CORS_ORIGINS, and never with credentials', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded', env: { API_CORS_ORIGINS: 'https://app.example' } });
  const preflight = await fetch(`${svc.url}/api/auth/me`, {
    method: 'OPTIONS',
    headers: {
      origin: 'https://app.example',
      'access-control-request-method': 'GET',
      'access-control-request-headers': 'authorization',
    },
  });
  t.equal(preflight.headers.get('access-control-allow-origin'), 'https://app.example');
  t.match(preflight.headers.get('access-control-allow-headers') ?? '', /authorization/);
  t.equal(preflight.headers.get('access-control-allow-credentials'), null, 'cookies never cross an origin');
  const stranger = await fetch(`${svc.url}/api/auth/me`, {
    method: 'OPTIONS',
    headers: { origin: 'https://evil.example', 'access-control-request-method': 'GET' },
  });
  t.equal(stranger.headers.get('access-control-allow-origin'), null);
  const simple = await fetch(`${svc.url}/api/openapi.json`, { headers: { origin: 'https://app.example' } });
  t.equal(simple.headers.get('access-control-allow-origin'), 'https://app.example');
});

t.test('EDGE=false serves the api role directly with the same behaviour', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded', env: { EDGE: 'false' } });
  const { key } = await signUp(svc);
  const me = await svc.http.get('/api/auth/me', { token: key });
  t.equal(me.status, 200);
  const audit = await svc.http.get('/api/audit?limit=1', { token: key });
  t.equal(audit.body.data[0].request_ip, '127.0.0.1', 'client address from the socket');
  const forged = await svc.http.get('/api/audit?limit=1', { token: key, headers: { 'x-svc-client-ip': '6.6.6.6' } });
  t.equal(forged.status, 200);
  await svc.http.post('/api/account/onboarding/complete', { token: key, headers: { 'x-svc-client-ip': '6.6.6.6' } });
  const after = await svc.http.get('/api/audit?limit=1', { token: key });
  t.equal(after.body.data[0].request_ip, '127.0.0.1', 'the header is ignored without the edge');
});

t.test('graceful shutdown lets a request under way finish, then refuses new ones', async (t) => {
  const provider = await startFakeProvider();
  t.teardown(() => provider.close());
  const svc = await startTestService(t, {
    backend: 'embedded',
    env: { ANTHROPIC_BASE_URL: provider.url, PROVIDER_CHECK_TIMEOUT_MS: '800' },
  });
  const { key } = await signUp(svc);
  const pending = fetch(`${svc.url}/api/account/inference-credentials/anthropic_api_key`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ value: 'slow-credential', validate: true }),
  });
  await new Promise((r) => setTimeout(r, 200));
  const closing = svc.close();
  const res = await pending;
  t.equal(res.status, 504, 'the request under way got its answer');
  t.equal(((await res.json()) as { error: string }).error, 'timeout');
  await closing;
  await t.rejects(fetch(`${svc.url}/api/openapi.json`), 'new connections are refused');
});

const haveRedisServer = (() => {
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

t.test(
  'a Redis that may evict keys is refused at start, naming the setting',
  { skip: !haveRedisServer && 'no redis-server on this machine' },
  async (t) => {
    // Its own redis-server, so changing the policy cannot disturb tests running beside this one.
    const { spawn: spawnChild } = await import('node:child_process');
    const port = 20000 + Math.floor(Math.random() * 20000);
    const child = spawnChild(
      'redis-server',
      ['--port', String(port), '--save', '', '--maxmemory-policy', 'allkeys-lru'],
      {
        stdio: 'ignore',
      },
    );
    t.teardown(() => {
      child.kill();
    });
    await new Promise((r) => setTimeout(r, 300));
    await t.rejects(
      startTestService(t, { backend: 'embedded', env: { REDIS_URL: `redis://127.0.0.1:${port}` } }),
      /maxmemory-policy noeviction/,
    );
  },
);
