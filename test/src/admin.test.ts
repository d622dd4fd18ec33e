import { admin as adminRows } from '@svc/db';
import t, { type Test } from 'tap';
import WebSocket from 'ws';
import {
  type Backend,
  backends,
  PASSWORD,
  type Reply,
  signUp,
  startTestService,
  type TestService,
  uniqueEmail,
} from './harness.ts';
import { SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { rawGet } from './sse-client.ts';
import { eventually } from './until.ts';

const until = (check: () => boolean | Promise<boolean>, ms = 20_000) => eventually(check, ms, 50);
/** Prompt text no admin answer may ever carry. */
const SECRET_PROMPT = 'the-tenant-private-prompt-7f3a91';

interface User {
  email: string;
  key: string;
  accountId: string;
}

/** A user ready to launch on the local provider: a credential and an ephemeral agent. */
async function launcher(svc: TestService): Promise<User & { launch: () => Promise<Reply> }> {
  const me = await signUp(svc);
  const { http } = svc;
  const token = me.key;
  await http.put('/api/account/inference-credentials/anthropic_api_key', {
    token,
    body: { value: 'sk-ant-test-credential-123456' },
  });
  const env = (await http.post('/api/environments', { token, body: { name: 'main' } })).body;
  const agent = (
    await http.post('/api/agents', {
      token,
      body: {
        name: 'coder',
        runtime: 'claude',
        model: 'anthropic/claude-sonnet-4-5',
        environment_id: env.id,
        sandbox_mode: 'ephemeral',
      },
    })
  ).body;
  const launch = () => http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: SECRET_PROMPT } });
  return { ...me, launch };
}

/** An open `/api/events/stream` of `key`, and whether the server has ended it. */
async function openStream(t: Test, svc: TestService, key: string) {
  const s = rawGet(svc, '/api/events/stream', { authorization: `Bearer ${key}` });
  t.teardown(() => s.sock.destroy());
  let ended = false;
  void s.closed.then(() => {
    ended = true;
  });
  t.ok(await until(() => s.text().includes(': connected')), 'the stream opened');
  return { ...s, ended: () => ended };
}

/** The status of a runner WebSocket upgrade with `token` (101 when it opened; closed at once). */
function upgradeStatus(svc: TestService, token: string): Promise<number> {
  return new Promise((resolve) => {
    const ws = new WebSocket(`${svc.url.replace(/^http/, 'ws')}/api/runners/connect`, {
      headers: { authorization: `Bearer ${token}` },
    });
    ws.on('open', () => {
      ws.close();
      resolve(101);
    });
    ws.on('unexpected-response', (_req, res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    ws.on('error', () => {});
  });
}

for (const backend of backends()) {
  t.test(`admin routes on ${backend}`, (t) => adminRoutes(t, backend));
}

async function adminRoutes(t: Test, backend: Backend) {
  const adminEmail = uniqueEmail('admin');
  const secondAdminEmail = uniqueEmail('admin2');
  const svc = await startTestService(t, {
    backend,
    env: {
      ADMIN_EMAILS: `${adminEmail},${secondAdminEmail}`,
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
    },
  });
  const { http } = svc;
  const root = await signUp(svc, adminEmail);
  const other = await signUp(svc, secondAdminEmail);
  const alice = await launcher(svc);
  const bob = await signUp(svc);
  const seen: string[] = [];
  const as = (token: string) => ({
    get: async (path: string) => {
      const res = await http.get(path, { token });
      seen.push(res.text);
      return res;
    },
    post: async (path: string, body?: unknown) => {
      const res = await http.post(path, { token, body: body ?? {} });
      seen.push(res.text);
      return res;
    },
    delete: async (path: string) => {
      const res = await http.delete(path, { token });
      seen.push(res.text);
      return res;
    },
  });
  const op = as(root.key);
  /** Bob's stream, opened while alice is suspended and ended when bob is deleted. */
  let bobsStream: Awaited<ReturnType<typeof openStream>> | undefined;
  const outer = t;

  await t.test('an ADMIN_EMAILS account is the first admin: it lists users with rows and page meta', async (t) => {
    const res = await op.get('/api/admin/users?sort=email&dir=asc&per_page=200');
    t.equal(res.status, 200, res.text);
    t.same(res.body.meta, { page: 1, per_page: 200, total: 4 });
    const me = res.body.data.find((u: { id: string }) => u.id === root.accountId);
    t.match(me, {
      id: root.accountId,
      email: adminEmail,
      role: 'admin',
      verified: true,
      comped: false,
      suspended: false,
      sandbox_limit: null,
      created_at: String,
      usage: { active_sandboxes: 0, conversations: 0, turns: 0 },
    });
    t.ok(me.last_active_at, 'last activity is the key just used');
    const emails = res.body.data.map((u: { email: string }) => u.email);
    t.same(emails, [...emails].sort(), 'sorted by email ascending');
  });

  await t.test('a user, or an admin with a standard-scope key, is 403 forbidden on every admin route', async (t) => {
    const standard = await http.post('/api/auth/api-keys', { token: root.key, body: { scope: 'standard' } });
    t.equal(standard.status, 201, standard.text);
    const routes: [string, string][] = [
      ['GET', '/api/admin/users'],
      ['GET', `/api/admin/users/${bob.accountId}`],
      ['POST', `/api/admin/users/${bob.accountId}/role`],
      ['POST', `/api/admin/users/${bob.accountId}/sandbox-limit`],
      ['POST', `/api/admin/users/${bob.accountId}/suspend`],
      ['POST', `/api/admin/users/${bob.accountId}/comp`],
      ['POST', `/api/admin/users/${bob.accountId}/credits`],
      ['DELETE', `/api/admin/users/${bob.accountId}`],
      ['GET', '/api/admin/sandboxes'],
      ['POST', '/api/admin/sandboxes/sbx_x/reap'],
      ['GET', '/api/admin/audit'],
      ['GET', '/api/admin/events'],
    ];
    for (const token of [bob.key, standard.body.key as string]) {
      for (const [method, path] of routes) {
        const res = await http.call(method, path, { token, ...(method === 'POST' ? { body: {} } : {}) });
        t.equal(res.status, 403, `${method} ${path}`);
        t.equal(res.body.error, 'forbidden');
      }
    }
    t.match((await http.get('/api/admin/users', { token: bob.key })).body.message, /admin/, 'the refusal says why');
    t.equal((await http.get('/api/admin/users')).status, 401, 'no credential: 401');
    t.equal((await http.get(`/api/admin/users/${bob.accountId}`, { token: root.key })).status, 200, 'bob is unharmed');
  });

  await t.test('the users list filters, pages, and refuses bad query values with 400', async (t) => {
    const byQ = await op.get(`/api/admin/users?q=${encodeURIComponent(bob.email.slice(0, 12))}`);
    t.same(
      byQ.body.data.map((u: { id: string }) => u.id),
      [bob.accountId],
      'q matches an email substring',
    );
    t.same(
      (await op.get(`/api/admin/users?q=${alice.accountId}`)).body.data.map((u: { id: string }) => u.id),
      [alice.accountId],
    );
    const admins = await op.get('/api/admin/users?role=admin');
    t.same(admins.body.data.map((u: { id: string }) => u.id).sort(), [root.accountId, other.accountId].sort());
    t.equal((await op.get('/api/admin/users?verified=false')).body.meta.total, 0);
    t.equal((await op.get('/api/admin/users?comped=true')).body.meta.total, 0);
    const p1 = await op.get('/api/admin/users?per_page=3&sort=created_at&dir=asc');
    const p2 = await op.get('/api/admin/users?per_page=3&page=2&sort=created_at&dir=asc');
    t.same(p1.body.meta, { page: 1, per_page: 3, total: 4 });
    t.same(p2.body.meta, { page: 2, per_page: 3, total: 4 });
    t.same(
      [...p1.body.data, ...p2.body.data].map((u: { id: string }) => u.id),
      [root.accountId, other.accountId, alice.accountId, bob.accountId],
      'pages follow one another in creation order',
    );
    t.equal((await op.get('/api/admin/users')).body.meta.per_page, 50, 'per_page defaults to 50');
    for (const bad of ['per_page=201', 'per_page=0', 'page=0', 'sort=password', 'dir=up', 'comped=yes', 'role=root']) {
      const res = await op.get(`/api/admin/users?${bad}`);
      t.equal(res.status, 400, bad);
      t.equal(res.body.error, 'invalid_request', bad);
    }
  });

  await t.test('one user; an unknown id is 404', async (t) => {
    const res = await op.get(`/api/admin/users/${bob.accountId}`);
    t.match(res.body, { id: bob.accountId, email: bob.email, role: 'user', suspended: false });
    const missing = await op.get('/api/admin/users/acc_nope');
    t.equal(missing.status, 404);
    t.equal(missing.body.error, 'not_found');
  });

  await t.test('role: a promoted user reaches admin routes; an own role change is 422', async (t) => {
    t.equal((await http.get('/api/admin/users', { token: bob.key })).status, 403);
    const up = await op.post(`/api/admin/users/${bob.accountId}/role`, { role: 'admin' });
    t.equal(up.status, 200, up.text);
    t.equal(up.body.role, 'admin');
    t.equal((await http.get('/api/admin/users', { token: bob.key })).status, 200, 'bob is an admin now');
    const down = await op.post(`/api/admin/users/${bob.accountId}/role`, { role: 'user' });
    t.equal(down.body.role, 'user');
    t.equal((await http.get('/api/admin/users', { token: bob.key })).status, 403, 'and no longer');
    const self = await op.post(`/api/admin/users/${root.accountId}/role`, { role: 'user' });
    t.equal(self.status, 422);
    t.same(Object.keys(self.body.details), ['id']);
    t.equal((await op.get(`/api/admin/users/${root.accountId}`)).body.role, 'admin', 'unchanged');
    const bad = await op.post(`/api/admin/users/${bob.accountId}/role`, { role: 'root' });
    t.equal(bad.status, 422);
    t.equal((await op.post('/api/admin/users/acc_nope/role', { role: 'user' })).status, 404);
  });

  await t.test('sandbox-limit replaces the default: a launch beyond it is 429 carrying the limit', async (t) => {
    const set = await op.post(`/api/admin/users/${alice.accountId}/sandbox-limit`, { limit: 1 });
    t.equal(set.status, 200, set.text);
    t.equal(set.body.sandbox_limit, 1);
    const first = await alice.launch();
    t.equal(first.status, 201, first.text);
    const second = await alice.launch();
    t.equal(second.status, 429, second.text);
    t.match(second.body, { error: 'sandbox_quota_exceeded', active: 1, limit: 1 });
    t.match(second.body.message, /limit is 1/);
    t.equal((await op.post(`/api/admin/users/${alice.accountId}/sandbox-limit`, { limit: -1 })).status, 422);
    t.equal((await op.post(`/api/admin/users/${alice.accountId}/sandbox-limit`, { limit: 'many' })).status, 422);
    const unknown = await op.post('/api/admin/users/acc_nope/sandbox-limit', { limit: 3 });
    t.equal(unknown.status, 404, 'an unknown id is 404');
    t.same(unknown.body, { error: 'not_found', message: 'No account has that id.' });
    const back = await op.post(`/api/admin/users/${alice.accountId}/sandbox-limit`, { limit: null });
    t.equal(back.body.sandbox_limit, null, 'null returns to the instance default');
    t.equal((await alice.launch()).status, 201, 'the default (10) lets a second one launch');
  });

  await t.test('sandboxes of every account, metadata only, paged and filtered', async (t) => {
    const res = await op.get(`/api/admin/sandboxes?account_id=${alice.accountId}`);
    t.equal(res.status, 200, res.text);
    t.equal(res.body.meta.total, 2);
    t.match(res.body.data[0], { id: /^sbx_/, account_id: alice.accountId, provider: 'local', conversations: 1 });
    const paged = await op.get('/api/admin/sandboxes?per_page=1&page=2');
    t.same(paged.body.meta, { page: 2, per_page: 1, total: 2 });
    t.equal((await op.get('/api/admin/sandboxes?status=asleep')).status, 400);
    const alices = await op.get(`/api/admin/users/${alice.accountId}`);
    t.equal(alices.body.usage.conversations, 2);
    t.equal(alices.body.usage.active_sandboxes, 2);
  });

  await t.test('reap destroys a sandbox through its provider and ends its conversation', async (t) => {
    const [sandbox] = (await op.get(`/api/admin/sandboxes?account_id=${alice.accountId}`)).body.data;
    const held = () => svc.local.held().some((h) => h.sandboxId === sandbox.id);
    t.ok(await until(held), 'its local machine is running');
    const conv = (await http.get(`/api/sandboxes/${sandbox.id}`, { token: alice.key })).body.conversations[0];
    const res = await op.post(`/api/admin/sandboxes/${sandbox.id}/reap`);
    t.equal(res.status, 200, res.text);
    t.match(res.body, { id: sandbox.id, account_id: alice.accountId, status: 'terminated' });
    t.ok(await until(() => !held()), 'the provider stopped its machine');
    const c = await http.get(`/api/conversations/${conv.id}`, { token: alice.key });
    t.equal(c.body.status, 'terminated');
    t.equal((await op.post(`/api/admin/sandboxes/${sandbox.id}/reap`)).status, 200, 'again: harmless');
    const missing = await op.post('/api/admin/sandboxes/sbx_nope/reap');
    t.equal(missing.status, 404);
    t.equal(missing.body.error, 'sandbox_not_found');
  });

  await t.test('suspend: 403 account_suspended on its key, its sandboxes stopped; restore', async (t) => {
    const live = (await op.get(`/api/admin/sandboxes?account_id=${alice.accountId}&status=ready`)).body.data;
    const provisioning = (await op.get(`/api/admin/sandboxes?account_id=${alice.accountId}&status=provisioning`)).body
      .data;
    const statuses = (await op.get(`/api/admin/sandboxes?account_id=${alice.accountId}`)).body.data.map(
      (s: { id: string; status: string }) => `${s.id} ${s.status}`,
    );
    t.equal(live.length + provisioning.length, 1, `one sandbox is still active (${statuses.join(', ')})`);
    const runner = await http.post('/api/runners', { token: alice.key, body: { name: 'box' } });
    t.equal(runner.status, 201, runner.text);
    t.equal(await upgradeStatus(svc, runner.body.token), 101, 'its runner token connects before');
    const login = await http.post('/api/auth/login', { body: { email: alice.email, password: PASSWORD } });
    const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0] as string;
    t.equal((await http.get('/api/auth/me', { cookie })).status, 200, 'a browser session before');
    const alicesStream = await openStream(t, svc, alice.key);
    bobsStream = await openStream(outer, svc, bob.key);
    const res = await op.post(`/api/admin/users/${alice.accountId}/suspend`, { suspended: true });
    t.equal(res.status, 200, res.text);
    t.ok(await until(alicesStream.ended), 'its open stream is ended');
    t.ok(alicesStream.text().endsWith('0\r\n\r\n'), 'ended, not cut: the chunked body is complete');
    t.notOk(bobsStream.ended(), 'another account’s stream stays open');
    const reopened = await http.get('/api/events/stream', { token: alice.key });
    t.equal(reopened.status, 403, 'a reconnect is refused');
    t.same(reopened.body, { error: 'account_suspended', message: 'This account is suspended.' });
    for (const path of ['/api/auth/login', '/api/auth/token']) {
      const refusedLogin = await http.post(path, { body: { email: alice.email, password: PASSWORD } });
      t.equal(refusedLogin.status, 403, `${path} with the right password`);
      t.same(refusedLogin.body, { error: 'account_suspended', message: 'This account is suspended.' });
    }
    t.equal(
      (await http.post('/api/auth/login', { body: { email: alice.email, password: 'not the password' } })).status,
      401,
      'a wrong password is still 401: the suspension is told only to whoever knows the password',
    );
    const session = await http.get('/api/auth/me', { cookie });
    t.equal(session.status, 403);
    t.equal(session.body.error, 'account_suspended', 'its browser session is refused too');
    t.match(res.body, { suspended: true, usage: { active_sandboxes: 0 } });
    const refused = await http.get('/api/agents', { token: alice.key });
    t.equal(refused.status, 403);
    t.same(refused.body, { error: 'account_suspended', message: 'This account is suspended.' });
    const all = (await op.get(`/api/admin/sandboxes?account_id=${alice.accountId}`)).body.data;
    t.same(
      all.map((s: { status: string }) => s.status),
      ['terminated', 'terminated'],
      'every sandbox of it is stopped',
    );
    t.ok(await until(() => svc.local.held().length === 0), 'no machine of it runs');
    t.equal(await upgradeStatus(svc, runner.body.token), 401, 'its runner token is refused');
    const self = await op.post(`/api/admin/users/${root.accountId}/suspend`, { suspended: true });
    t.equal(self.status, 422);
    const unknown = await op.post('/api/admin/users/acc_nope/suspend', { suspended: true });
    t.equal(unknown.status, 404, 'an unknown id is 404');
    t.same(unknown.body, { error: 'not_found', message: 'No account has that id.' });
    t.equal((await http.get('/api/agents', { token: root.key })).status, 200, 'the admin is not suspended');
    const restored = await op.post(`/api/admin/users/${alice.accountId}/suspend`, { suspended: false });
    t.equal(restored.body.suspended, false);
    t.equal((await http.get('/api/agents', { token: alice.key })).status, 200, 'its key works again');
    t.equal(await upgradeStatus(svc, runner.body.token), 101, 'and its runner token');
  });

  await t.test('cross-tenant audit names each row’s account; prompt text never appears', async (t) => {
    const res = await op.get('/api/admin/audit?limit=500');
    t.equal(res.status, 200, res.text);
    const accountsSeen = new Set(res.body.data.map((r: { account_id: string }) => r.account_id));
    t.ok(accountsSeen.has(alice.accountId) && accountsSeen.has(root.accountId), 'rows of several tenants');
    const one = await op.get(`/api/admin/audit?account_id=${bob.accountId}`);
    t.ok(one.body.data.length > 0);
    t.ok(one.body.data.every((r: { account_id: string }) => r.account_id === bob.accountId));
    t.equal((await op.get('/api/admin/audit?since=yesterday')).status, 400);
    const own = await http.get('/api/audit', { token: alice.key });
    t.notOk('account_id' in own.body.data[0], 'the tenant route is unchanged');
  });

  await t.test('delete: the account is erased as DELETE /api/account does; self-delete is 422', async (t) => {
    const self = await op.delete(`/api/admin/users/${root.accountId}`);
    t.equal(self.status, 422);
    t.notOk(bobsStream?.ended(), 'bob’s stream is open until then');
    const res = await op.delete(`/api/admin/users/${bob.accountId}`);
    t.equal(res.status, 204);
    t.ok(await until(() => bobsStream?.ended() === true), 'the erased account’s open stream is ended');
    t.equal((await op.get(`/api/admin/users/${bob.accountId}`)).status, 404);
    t.equal((await http.get('/api/agents', { token: bob.key })).status, 401, 'its key is gone');
    t.equal((await op.delete(`/api/admin/users/${bob.accountId}`)).status, 404);
  });

  await t.test('the privilege trail records who did what to whom, newest first', async (t) => {
    const res = await op.get('/api/admin/events?per_page=200');
    t.equal(res.status, 200, res.text);
    const trail = res.body.data.map((e: { action: string; target_id: string; admin_id: string }) => [
      e.action,
      e.target_id,
      e.admin_id,
    ]);
    const [sandboxReaped] = res.body.data.filter((e: { action: string }) => e.action === 'admin.sandbox.reap');
    t.same(trail.reverse(), [
      ['admin.user.role', bob.accountId, root.accountId],
      ['admin.user.role', bob.accountId, root.accountId],
      ['admin.user.sandbox_limit', alice.accountId, root.accountId],
      ['admin.user.sandbox_limit', alice.accountId, root.accountId],
      ['admin.sandbox.reap', sandboxReaped.target_id, root.accountId],
      ['admin.sandbox.reap', sandboxReaped.target_id, root.accountId],
      ['admin.user.suspend', alice.accountId, root.accountId],
      ['admin.user.suspend', alice.accountId, root.accountId],
      ['admin.user.delete', bob.accountId, root.accountId],
    ]);
    t.match(res.body.data[0], { created_at: String, target_type: 'account', metadata: {} });
    t.same(res.body.meta, { page: 1, per_page: 200, total: 9 });
    const suspend = res.body.data.find(
      (e: { action: string; metadata: { suspended?: boolean } }) =>
        e.action === 'admin.user.suspend' && e.metadata.suspended,
    );
    t.same(suspend.metadata, { suspended: true, sandboxes_stopped: 1 });
    t.same(sandboxReaped.metadata, { account_id: alice.accountId, status_before: 'terminated' });
    t.equal((await op.get('/api/admin/events?per_page=2&page=5')).body.data.length, 1, 'the last page');
  });

  await t.test('an action this node does not know (recorded by a newer one) is listed, not an error', async (t) => {
    await adminRows.insertAdminEvent(svc.db.sql, {
      adminId: root.accountId,
      action: 'admin.runner.revoke',
      targetType: 'runner',
      targetId: 'rnr_future',
      metadata: { reason: 'rolling deploy' },
      requestIp: null,
    });
    const res = await op.get('/api/admin/events?per_page=1');
    t.equal(res.status, 200, res.text);
    t.match(res.body.data[0], {
      action: 'admin.runner.revoke',
      target_type: 'runner',
      target_id: 'rnr_future',
      metadata: { reason: 'rolling deploy' },
    });
  });

  t.test('no admin answer carried the prompt text of a tenant', async (t) => {
    t.ok(seen.length > 40);
    t.notOk(
      seen.some((text) => text.includes(SECRET_PROMPT)),
      'the prompt stays in its tenant',
    );
    const own = await http.get('/api/conversations', { token: alice.key });
    t.ok(own.status === 200, 'while the tenant itself still reads its own conversations');
  });
}
