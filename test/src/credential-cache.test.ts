import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import pino from 'pino';
import postgres from 'postgres';
import t from 'tap';
import { invalidationsContract } from '../../gateway/src/invalidation/invalidation.contract.ts';
import { MemoryInvalidationHub, memoryInvalidations } from '../../gateway/src/invalidation/invalidation.memory.ts';
import { redisInvalidations } from '../../gateway/src/invalidation/invalidation.redis.ts';
import { type CachedCredential, CredentialCache } from '../../gateway/src/services/credential-cache.ts';
import { authenticateBearer } from '../../gateway/src/services/credentials.ts';
import { backends, PASSWORD, signUp, startTestService, twoNodes, uniqueEmail } from './harness.ts';

const silent = pino({ level: 'silent' });
const redisUrl = process.env.TEST_REDIS_URL;

t.test('the memory invalidations contract', async (t) =>
  invalidationsContract(t, async () => {
    const hub = new MemoryInvalidationHub();
    return async () => memoryInvalidations(hub);
  }),
);

t.test('the Redis invalidations contract', { skip: !redisUrl && 'needs Redis' }, async (t) => {
  const clients: Redis[] = [];
  t.teardown(() => Promise.all(clients.map((c) => c.quit().catch(() => {}))));
  const client = () => {
    const c = new Redis(redisUrl as string);
    clients.push(c);
    return c;
  };
  invalidationsContract(t, async () => {
    const prefix = `inv${randomBytes(4).toString('hex')}:`;
    return async () => redisInvalidations({ redis: client(), subscriber: client(), prefix, logger: silent });
  });

  t.test('a node whose subscription was cut forgets everything once it is back', async (t) => {
    const prefix = `inv${randomBytes(4).toString('hex')}:`;
    const subscriber = client();
    const id = await subscriber.client('ID');
    const node = redisInvalidations({ redis: client(), subscriber, prefix, logger: silent });
    t.teardown(() => node.close());
    let resets = 0;
    await node.listen(
      () => {},
      () => resets++,
    );
    t.equal(resets, 0, 'nothing to forget at the first subscription');
    await client().client('KILL', 'ID', String(id));
    for (let i = 0; i < 300 && resets < 2; i++) await new Promise((r) => setTimeout(r, 10));
    t.equal(resets, 2, 'the reconnect ran onReset, then again once the subscription was live');
  });

  t.test('a publish Redis refused is sent again once it takes it', async (t) => {
    const prefix = `inv${randomBytes(4).toString('hex')}:`;
    const publisher = new Redis(redisUrl as string, { enableOfflineQueue: false, lazyConnect: true });
    clients.push(publisher);
    await publisher.connect();
    const sender = redisInvalidations({ redis: publisher, subscriber: client(), prefix, logger: silent });
    const hearer = redisInvalidations({ redis: client(), subscriber: client(), prefix, logger: silent });
    t.teardown(() => Promise.all([sender.close(), hearer.close()]));
    const heard: string[] = [];
    await hearer.listen(
      (a) => heard.push(a),
      () => {},
    );
    await sender.listen(
      () => {},
      () => {},
    );
    publisher.disconnect();
    await sender.publish('acc_while_down');
    await new Promise((r) => setTimeout(r, 100));
    t.same(heard, [], 'nothing went out while Redis was unreachable');
    await publisher.connect();
    for (let i = 0; i < 300 && heard.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    t.same(heard, ['acc_while_down'], 'the other node heard it once Redis took it');
  });
});

t.test('the credential cache', async (t) => {
  let now = 1_000_000;
  const entry = (accountId: string, over: Partial<CachedCredential> = {}): CachedCredential => ({
    accountId,
    actor: 'api',
    scope: 'full',
    role: 'user',
    credentialId: `key_${accountId}`,
    suspended: false,
    expiresAt: null,
    lastUsedAt: null,
    ...over,
  });
  const make = (ttlMs = 10_000, maxEntries = 100) => {
    const hub = new MemoryInvalidationHub();
    const here = new CredentialCache({ ttlMs, maxEntries, invalidations: memoryInvalidations(hub), now: () => now });
    const there = new CredentialCache({ ttlMs, maxEntries, invalidations: memoryInvalidations(hub), now: () => now });
    return { here, there, started: Promise.all([here.start(), there.start()]) };
  };

  t.test('an entry is served until its time to live runs out', async (t) => {
    const { here, started } = make(10_000);
    await started;
    here.put('h1', entry('acc_a'), here.begin());
    t.equal(here.get('h1')?.accountId, 'acc_a');
    now += 9_999;
    t.ok(here.get('h1'), 'still there just before the end');
    now += 1;
    t.equal(here.get('h1'), undefined, 'gone at the end');
  });

  t.test("never past the credential's own expiry", async (t) => {
    const { here, started } = make(10_000);
    await started;
    here.put('h1', entry('acc_a', { expiresAt: now + 500 }), here.begin());
    now += 500;
    t.equal(here.get('h1'), undefined);
  });

  t.test("forgetting an account drops its entries here and on the other node, and no one else's", async (t) => {
    const { here, there, started } = make();
    await started;
    for (const c of [here, there]) {
      c.put('a1', entry('acc_a'), c.begin());
      c.put('a2', entry('acc_a'), c.begin());
      c.put('b1', entry('acc_b'), c.begin());
    }
    await here.forgetAccount('acc_a');
    t.equal(here.get('a1'), undefined, 'gone here at once');
    t.equal(here.get('a2'), undefined);
    t.ok(here.get('b1'), "another account's entry stays");
    for (let i = 0; i < 10 && there.size !== 1; i++) await new Promise((r) => setImmediate(r));
    t.equal(there.get('a1'), undefined, 'gone on the other node');
    t.ok(there.get('b1'));
  });

  t.test('what a lookup read before a forget is not stored', async (t) => {
    const { here, started } = make();
    await started;
    const ticket = here.begin();
    await here.forgetAccount('acc_a');
    here.put('a1', entry('acc_a'), ticket);
    t.equal(here.get('a1'), undefined, 'the stale read was dropped');
    here.put('a1', entry('acc_a'), here.begin());
    t.ok(here.get('a1'), 'a read after the forget is stored');
  });

  t.test('the oldest entry goes when the cache is full', async (t) => {
    const { here, started } = make(10_000, 2);
    await started;
    here.put('h1', entry('acc_a'), here.begin());
    here.put('h2', entry('acc_b'), here.begin());
    here.put('h3', entry('acc_c'), here.begin());
    t.equal(here.size, 2);
    t.equal(here.get('h1'), undefined);
    t.ok(here.get('h3'));
  });

  t.test('a time to live of 0 stores nothing', async (t) => {
    const { here, started } = make(0);
    await started;
    here.put('h1', entry('acc_a'), here.begin());
    t.equal(here.get('h1'), undefined);
  });
});

t.test(
  'a cached key costs no statement: one SELECT for many requests, and no UPDATE while last_used_at would not move',
  { skip: !process.env.TEST_DATABASE_URL && 'needs Postgres' },
  async (t) => {
    const svc = await startTestService(t, { backend: 'postgres+redis' });
    const me = await signUp(svc);
    const statements: string[] = [];
    const sql = postgres(svc.config.DATABASE_URL as string, {
      max: 1,
      onnotice: () => {},
      debug: (_conn, query) => statements.push(query.trim().split(/\s+/)[0]?.toUpperCase() ?? ''),
    });
    t.teardown(() => sql.end());
    await sql`SELECT 1`; // the driver's own first queries (types) are not authentication's
    statements.length = 0;
    const credentialCache = new CredentialCache({
      ttlMs: 60_000,
      maxEntries: 10,
      invalidations: memoryInvalidations(),
    });
    // signUp used the key once, so its last_used_at was stamped within the minute.
    for (let i = 0; i < 20; i++) {
      const p = await authenticateBearer({ sql, credentialCache }, me.key, '127.0.0.1');
      t.equal(p?.accountId, me.accountId);
    }
    await new Promise((r) => setTimeout(r, 100)); // a touch is fired without waiting
    t.same(statements, ['SELECT'], 'twenty requests, one SELECT, no UPDATE');

    statements.length = 0;
    const uncached = new CredentialCache({ ttlMs: 0, maxEntries: 10, invalidations: memoryInvalidations() });
    for (let i = 0; i < 3; i++) await authenticateBearer({ sql, credentialCache: uncached }, me.key, null);
    await new Promise((r) => setTimeout(r, 100));
    t.same(statements, ['SELECT', 'SELECT', 'SELECT'], 'with the cache off, a SELECT each time and still no UPDATE');

    t.equal(
      await authenticateBearer({ sql, credentialCache }, 'svc_not-a-key', null),
      undefined,
      'an unknown key is refused',
    );
    t.equal(await authenticateBearer({ sql, credentialCache }, 'svc_not-a-key', null), undefined);
    t.equal(credentialCache.size, 1, 'and never remembered');
  },
);

for (const backend of backends()) {
  t.test(`${backend}: a change to an account's credentials is seen by the next request on this node`, async (t) => {
    const admin = uniqueEmail('admin');
    const svc = await startTestService(t, { backend, env: { AUTH_CACHE_TTL_MS: '300000', ADMIN_EMAILS: admin } });
    const boss = await signUp(svc, admin);
    const me = await signUp(svc);
    const second = await svc.http.post('/api/auth/api-keys', {
      token: me.key,
      body: { name: 'second', scope: 'full' },
    });
    t.equal(second.status, 201);
    t.equal((await svc.http.get('/api/auth/me', { token: second.body.key })).status, 200, 'the key works (now cached)');
    const revoked = await svc.http.delete(`/api/auth/api-keys/${second.body.id}`, { token: me.key });
    t.equal(revoked.status, 204);
    const after = await svc.http.get('/api/auth/me', { token: second.body.key });
    t.equal(after.status, 401, 'a revoked key is refused at once');
    t.equal(after.body.error, 'unauthorized');

    t.equal((await svc.http.get('/api/auth/me', { token: me.key })).status, 200);
    const suspended = await svc.http.post(`/api/admin/users/${me.accountId}/suspend`, {
      token: boss.key,
      body: { suspended: true },
    });
    t.equal(suspended.status, 200);
    const refused = await svc.http.get('/api/auth/me', { token: me.key });
    t.equal(refused.status, 403, 'a suspended account is refused at once');
    t.equal(refused.body.error, 'account_suspended');
    await svc.http.post(`/api/admin/users/${me.accountId}/suspend`, { token: boss.key, body: { suspended: false } });
    t.equal((await svc.http.get('/api/auth/me', { token: me.key })).status, 200, 'and served again once restored');

    const promoted = await svc.http.post(`/api/admin/users/${me.accountId}/role`, {
      token: boss.key,
      body: { role: 'admin' },
    });
    t.equal(promoted.status, 200);
    t.equal((await svc.http.get('/api/admin/users', { token: me.key })).status, 200, 'a new role counts at once');
  });
}

for (const backend of backends()) {
  t.test(`${backend}: a secret remembered as one kind of credential is not taken as the other`, async (t) => {
    const svc = await startTestService(t, { backend, env: { AUTH_CACHE_TTL_MS: '300000' } });
    const me = await signUp(svc);
    const asCookie = (secret: string) =>
      fetch(`${svc.url}/api/auth/me`, { headers: { cookie: `svc_session=${secret}` } });
    const asBearer = (secret: string) =>
      fetch(`${svc.url}/api/auth/me`, { headers: { authorization: `Bearer ${secret}` } });

    t.equal((await asBearer(me.key)).status, 200, 'the API key works as a bearer key (and is now cached)');
    const keyAsCookie = await asCookie(me.key);
    t.equal(keyAsCookie.status, 401, 'the same key sent as a session cookie is refused');
    t.equal(((await keyAsCookie.json()) as { error: string }).error, 'unauthorized');

    const login = await fetch(`${svc.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ email: me.email, password: PASSWORD }),
    });
    const session = /svc_session=([^;]+)/.exec(login.headers.get('set-cookie') ?? '')?.[1] as string;
    t.ok(session, 'a session cookie was set');
    t.equal((await asCookie(session)).status, 200, 'the session works as a cookie (and is now cached)');
    t.equal((await asBearer(session)).status, 401, 'the same secret sent as a bearer key is refused');
  });
}

t.test(
  'a revocation on one node is seen on the other through Redis, not by waiting for the cache to expire',
  { skip: !redisUrl && 'needs Redis' },
  async (t) => {
    const admin = uniqueEmail('admin');
    const env = { AUTH_CACHE_TTL_MS: '300000', ADMIN_EMAILS: admin };
    const { a, b } = await twoNodes(t, env);
    const boss = await signUp(a, admin);
    const me = await signUp(a);
    const key = async (name: string) =>
      (await a.http.post('/api/auth/api-keys', { token: me.key, body: { name, scope: 'full' } })).body as {
        id: string;
        key: string;
      };
    const seenRefused = async (token: string, status: number) => {
      const started = Date.now();
      for (;;) {
        const r = await b.http.get('/api/auth/me', { token });
        if (r.status === status || Date.now() - started > 10_000) return { r, ms: Date.now() - started };
        await new Promise((res) => setTimeout(res, 5));
      }
    };

    // Node B caches: a key revoked behind the service's back (no one is told) still works there.
    const quiet = await key('revoked behind its back');
    t.equal((await b.http.get('/api/auth/me', { token: quiet.key })).status, 200);
    const direct = postgres(a.config.DATABASE_URL as string, { max: 1, onnotice: () => {} });
    t.teardown(() => direct.end());
    await direct`UPDATE api_keys SET revoked_at = now() WHERE id = ${quiet.id}`;
    t.equal((await b.http.get('/api/auth/me', { token: quiet.key })).status, 200, 'node B served it from its cache');

    const told = await key('revoked through node A');
    t.equal((await b.http.get('/api/auth/me', { token: told.key })).status, 200);
    t.equal((await a.http.delete(`/api/auth/api-keys/${told.id}`, { token: me.key })).status, 204);
    const revoked = await seenRefused(told.key, 401);
    t.equal(revoked.r.status, 401, 'node B refuses the key revoked on node A');
    t.comment(`node B refused the revoked key ${revoked.ms} ms after node A answered`);

    t.equal((await b.http.get('/api/auth/me', { token: me.key })).status, 200);
    const s = await a.http.post(`/api/admin/users/${me.accountId}/suspend`, {
      token: boss.key,
      body: { suspended: true },
    });
    t.equal(s.status, 200);
    const suspended = await seenRefused(me.key, 403);
    t.equal(suspended.r.status, 403, 'node B refuses the account suspended on node A');
    t.equal(suspended.r.body.error, 'account_suspended');
    t.comment(`node B refused the suspended account ${suspended.ms} ms after node A answered`);

    // A browser session ended on node A.
    const login = await fetch(`${a.url}/api/auth/login`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ email: boss.email, password: PASSWORD }),
    });
    const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0] as string;
    t.match(cookie, /^svc_session=/);
    const meOnB = () => fetch(`${b.url}/api/auth/me`, { headers: { cookie } });
    t.equal((await meOnB()).status, 200);
    const out = await fetch(`${a.url}/api/auth/logout`, { method: 'POST', headers: { cookie, origin: a.url } });
    t.equal(out.status, 204);
    let status = 200;
    for (let i = 0; i < 2000 && status === 200; i++) status = (await meOnB()).status;
    t.equal(status, 401, 'node B refuses the session ended on node A');
  },
);
