import { bindingHeader, newId, SECRET_BINDING_PRESETS } from '@svc/core';
import { conversations, egressLog, secretBindings } from '@svc/db';
import { createLogger, loadConfig } from '@svc/gateway';
import t from 'tap';
import { issueSandboxToken } from '../../gateway/src/services/credentials.ts';
import { EgressLogSweeper } from '../../gateway/src/workers/egress-log-sweep.ts';
import { primaryBackend, signUp, startTestService, type TestService } from './harness.ts';

/*
 * The egress credential broker's routes (SPEC "Secret bindings", DECISIONS "Sandboxes that
 * hold"): secret bindings for full-scope keys, a conversation's egress log, and both gone
 * (404 `broker: "disabled"`) while EGRESS_BROKER is off.
 */

/** A conversation record of the account (no sandbox: the egress log needs only the row). */
async function conversationOf(svc: TestService, accountId: string): Promise<string> {
  const id = newId('cnv');
  await conversations.insertConversation(svc.db.sql, {
    id,
    accountId,
    agentId: 'agt_egress_test',
    title: 'egress',
    source: 'ui',
  });
  return id;
}

const row = (accountId: string, conversationId: string, n: number, over: Partial<egressLog.EgressInsert> = {}) => ({
  accountId,
  conversationId,
  at: new Date(Date.UTC(2026, 10, 23, 6, 0, n)),
  host: 'api.github.com',
  port: 443,
  method: 'GET',
  bindingId: null,
  status: 200,
  latencyMs: 40 + n,
  refused: false,
  reason: null,
  ...over,
});

t.test(
  'EGRESS_BROKER is on where sandboxes are isolated unless set; BROKER_LOG_RETENTION_HOURS defaults to 72',
  async (t) => {
    t.equal(loadConfig({}).EGRESS_BROKER, 'on', 'isolation namespaces by default: on');
    t.equal(loadConfig({ SANDBOX_ISOLATION: 'none' }).EGRESS_BROKER, 'off', 'no isolation: off');
    t.equal(loadConfig({ SANDBOX_ISOLATION: 'none', EGRESS_BROKER: 'on' }).EGRESS_BROKER, 'on', 'set: as set');
    t.equal(loadConfig({ EGRESS_BROKER: 'off' }).EGRESS_BROKER, 'off');
    t.throws(() => loadConfig({ EGRESS_BROKER: 'yes' }), /EGRESS_BROKER/);
    t.equal(loadConfig({}).BROKER_LOG_RETENTION_HOURS, 72);
    t.equal(loadConfig({ BROKER_LOG_RETENTION_HOURS: '1' }).BROKER_LOG_RETENTION_HOURS, 1);
    t.throws(() => loadConfig({ BROKER_LOG_RETENTION_HOURS: '0' }), /BROKER_LOG_RETENTION_HOURS/);
    t.throws(() => loadConfig({ BROKER_LOG_RETENTION_HOURS: '1.5' }), /BROKER_LOG_RETENTION_HOURS/);
  },
);

t.test('a binding renders its header: presets, basic base64-encoded, a custom format', async (t) => {
  t.same(bindingHeader('bearer', 'sk-1'), { name: 'authorization', value: 'Bearer sk-1' });
  t.same(bindingHeader('github', 'ghp_x'), { name: 'authorization', value: 'token ghp_x' });
  t.same(bindingHeader('x-api-key', 'k'), { name: 'x-api-key', value: 'k' });
  t.same(bindingHeader('basic', 'user:pass'), {
    name: 'authorization',
    value: `Basic ${Buffer.from('user:pass').toString('base64')}`,
  });
  t.same(bindingHeader({ header: 'X-Token', format: 'v1 {value} end' }, 'a$&b'), {
    name: 'x-token',
    value: 'v1 a$&b end',
  });
});

t.test('secret bindings and the egress log with the broker on', async (t) => {
  const svc = await startTestService(t, { backend: primaryBackend() });
  t.equal(svc.config.EGRESS_BROKER, 'on', 'on by default (sandboxes are isolated)');
  const { http } = svc;
  const me = await signUp(svc);
  const token = me.key;
  const patch = (path: string, body: unknown, tok = token) => http.call('PATCH', path, { token: tok, body });
  const list = async () => (await http.get('/api/secret-bindings', { token })).body.data as Record<string, unknown>[];

  t.test('/me says brokered', async (t) => {
    const res = await http.get('/api/auth/me', { token });
    t.equal(res.status, 200);
    t.equal(res.body.brokered, true);
  });

  t.test('the presets are listed with their header, format and hosts', async (t) => {
    const res = await http.get('/api/secret-bindings/presets', { token });
    t.equal(res.status, 200, res.text);
    t.same(res.body.data, [
      { name: 'bearer', header: 'authorization', format: 'Bearer {value}', hosts: [] },
      { name: 'basic', header: 'authorization', format: 'Basic {value}', hosts: [] },
      { name: 'x-api-key', header: 'x-api-key', format: '{value}', hosts: [] },
      { name: 'github', header: 'authorization', format: 'token {value}', hosts: ['api.github.com', 'github.com'] },
    ]);
    t.same(
      res.body.data.map((p: { name: string }) => p.name),
      Object.keys(SECRET_BINDING_PRESETS),
      'the table the runner reads',
    );
  });

  t.test('create, list, update and delete a binding, each audited', async (t) => {
    const made = await http.post('/api/secret-bindings', {
      token,
      body: { secret_name: 'GITHUB_TOKEN', host: 'API.GitHub.com', shape: 'github' },
    });
    t.equal(made.status, 201, made.text);
    t.match(made.body, { secret_name: 'GITHUB_TOKEN', host: 'api.github.com', shape: 'github' });
    t.match(made.body.id, /^sbd_[0-9a-z]{26}$/);
    t.same(Object.keys(made.body).sort(), ['created_at', 'host', 'id', 'secret_name', 'shape', 'updated_at']);
    const id = made.body.id as string;

    const custom = await http.post('/api/secret-bindings', {
      token,
      body: {
        secret_name: 'SHOP_KEY',
        host: '*.shop.example.com:8443',
        shape: { header: 'X-Shop-Key', format: 'k={value}' },
      },
    });
    t.equal(custom.status, 201, custom.text);
    t.same(custom.body.shape, { header: 'X-Shop-Key', format: 'k={value}' });
    t.equal(custom.body.host, '*.shop.example.com:8443');
    t.same(await list(), [made.body, custom.body], 'oldest first, as created');

    const renamed = await patch(`/api/secret-bindings/${id}`, { secret_name: 'GH_TOKEN', shape: 'bearer' });
    t.equal(renamed.status, 200, renamed.text);
    t.match(renamed.body, { id, secret_name: 'GH_TOKEN', host: 'api.github.com', shape: 'bearer' });
    t.equal(renamed.body.created_at, made.body.created_at);
    t.ok(renamed.body.updated_at >= made.body.updated_at);
    const moved = await patch(`/api/secret-bindings/${id}`, { host: 'github.com' });
    t.match(moved.body, { secret_name: 'GH_TOKEN', host: 'github.com', shape: 'bearer' }, 'the other fields stay');
    t.same(
      (await list()).find((b) => b.id === id),
      moved.body,
      'the list shows the change',
    );

    const gone = await http.delete(`/api/secret-bindings/${id}`, { token });
    t.equal(gone.status, 204);
    t.same(await list(), [custom.body]);
    t.equal((await http.delete(`/api/secret-bindings/${id}`, { token })).status, 404, 'a second delete finds nothing');
    t.equal((await patch(`/api/secret-bindings/${id}`, { host: 'x.example.com' })).status, 404);

    const audit = (await http.get('/api/audit?action_prefix=secret_binding.', { token })).body.data as {
      action: string;
      resource_type: string;
      resource_id: string;
      metadata: Record<string, unknown>;
    }[];
    t.same(
      audit.map((a) => [a.action, a.resource_id]),
      [
        ['secret_binding.deleted', id],
        ['secret_binding.updated', id],
        ['secret_binding.updated', id],
        ['secret_binding.created', custom.body.id],
        ['secret_binding.created', id],
      ],
    );
    t.ok(audit.every((a) => a.resource_type === 'secret_binding'));
    t.same(audit[4]?.metadata, { secret_name: 'GITHUB_TOKEN', host: 'api.github.com', shape: 'github' });
    t.same(audit[2]?.metadata, {
      fields: ['secret_name', 'shape'],
      secret_name: 'GH_TOKEN',
      host: 'api.github.com',
      shape: 'bearer',
    });
    await http.delete(`/api/secret-bindings/${custom.body.id}`, { token });
  });

  t.test('a second binding of the same name and host is 409 binding_exists, by create or update', async (t) => {
    const body = { secret_name: 'NPM_TOKEN', host: 'registry.npmjs.org', shape: 'bearer' };
    const first = await http.post('/api/secret-bindings', { token, body });
    t.equal(first.status, 201);
    const again = await http.post('/api/secret-bindings', { token, body: { ...body, shape: 'x-api-key' } });
    t.equal(again.status, 409);
    t.equal(again.body.error, 'binding_exists');
    t.match(again.body.message, /NPM_TOKEN is already bound to registry\.npmjs\.org/);
    const upper = await http.post('/api/secret-bindings', { token, body: { ...body, host: 'Registry.NPMJS.org' } });
    t.equal(upper.status, 409, 'hosts compare in lower case');
    const otherHost = await http.post('/api/secret-bindings', { token, body: { ...body, host: 'npm.example.com' } });
    t.equal(otherHost.status, 201, 'the same name on another host is another binding');
    const clash = await patch(`/api/secret-bindings/${otherHost.body.id}`, { host: 'registry.npmjs.org' });
    t.equal(clash.status, 409);
    t.equal(clash.body.error, 'binding_exists');
    t.same(
      (await list()).map((b) => [b.secret_name, b.host, b.shape]),
      [
        ['NPM_TOKEN', 'registry.npmjs.org', 'bearer'],
        ['NPM_TOKEN', 'npm.example.com', 'bearer'],
      ],
      'nothing changed',
    );
    const bound = await secretBindings.bindingsForSecrets(svc.db.sql, me.accountId, ['NPM_TOKEN', 'UNBOUND']);
    t.same(
      bound.map((b) => [b.secret_name, b.host, b.shape]),
      [
        ['NPM_TOKEN', 'npm.example.com', 'bearer'],
        ['NPM_TOKEN', 'registry.npmjs.org', 'bearer'],
      ],
      'what a sandbox holding NPM_TOKEN has bound, by name then host',
    );
    t.same(await secretBindings.bindingsForSecrets(svc.db.sql, me.accountId, []), []);
    t.same(await secretBindings.bindingsForSecrets(svc.db.sql, 'acc_nobody', ['NPM_TOKEN']), [], 'own account only');
    const audit = (await http.get('/api/audit?action_prefix=secret_binding.created', { token })).body.data;
    t.equal(audit.filter((a: { resource_id: string }) => a.resource_id === otherHost.body.id).length, 1);
    t.equal(
      (await http.get('/api/audit?action_prefix=secret_binding.updated', { token })).body.data.length,
      2,
      'the refused update was not audited',
    );
    for (const b of await list()) await http.delete(`/api/secret-bindings/${b.id}`, { token });
  });

  t.test('a bad host, format, header, name or unknown field is 422 and changes nothing', async (t) => {
    const good = { secret_name: 'OTHER_KEY', host: 'api.example.com', shape: 'bearer' };
    const kept = await http.post('/api/secret-bindings', { token, body: { ...good, secret_name: 'API_KEY' } });
    t.equal(kept.status, 201);
    // [what, body, the field named, also refused as an update]
    const cases: [string, Record<string, unknown>, string, boolean?][] = [
      ['a URL as host', { ...good, host: 'https://api.example.com/' }, 'host'],
      ['a host with a path', { ...good, host: 'api.example.com/v1' }, 'host'],
      ['a wildcard inside a host', { ...good, host: 'api.*.example.com' }, 'host'],
      ['an empty host', { ...good, host: '' }, 'host'],
      ['an unknown preset', { ...good, shape: 'oauth' }, 'shape'],
      ['a format without {value}', { ...good, shape: { header: 'x-key', format: 'Bearer' } }, 'shape'],
      ['a format with {value} twice', { ...good, shape: { header: 'x-key', format: '{value}:{value}' } }, 'shape'],
      ['a format with a line break', { ...good, shape: { header: 'x-key', format: '{value}\r\nX-Evil: 1' } }, 'shape'],
      ['a header with a space', { ...good, shape: { header: 'x key', format: '{value}' } }, 'shape'],
      ['a header with a colon', { ...good, shape: { header: 'x-key:', format: '{value}' } }, 'shape'],
      [
        'a header that frames the request',
        { ...good, shape: { header: 'Content-Length', format: '{value}' } },
        'shape',
      ],
      [
        'a shape with another field',
        { ...good, shape: { header: 'x-key', format: '{value}', encode: 'b64' } },
        'shape',
      ],
      ['a secret name that is no variable name', { ...good, secret_name: 'API-KEY' }, 'secret_name'],
      ['an unknown field', { ...good, value: 'the secret itself' }, ''],
      ['no shape', { secret_name: 'OTHER_KEY', host: 'api.example.com' }, 'shape', false],
    ];
    for (const [what, body, field, onUpdate = true] of cases) {
      const res = await http.post('/api/secret-bindings', { token, body });
      t.equal(res.status, 422, `${what}: ${res.text}`);
      t.equal(res.body.error, 'validation_failed', what);
      if (field)
        t.ok(
          Object.keys(res.body.details ?? {}).some((k) => k.startsWith(field)),
          `${what} names ${field}`,
        );
      if (!onUpdate) continue;
      const update = await patch(`/api/secret-bindings/${kept.body.id}`, body);
      t.equal(update.status, 422, `${what}, as an update`);
    }
    const unknown = await patch(`/api/secret-bindings/${kept.body.id}`, { nickname: 'x' });
    t.equal(unknown.status, 422, 'an unknown field on update');
    t.same(await list(), [kept.body], 'nothing created, nothing changed');
    t.equal((await http.get('/api/audit?action_prefix=secret_binding.updated', { token })).body.data.length, 2);
    await http.delete(`/api/secret-bindings/${kept.body.id}`, { token });
  });

  t.test("another tenant's binding is 404; its list is its own", async (t) => {
    const made = await http.post('/api/secret-bindings', {
      token,
      body: { secret_name: 'MINE', host: 'api.example.com', shape: 'bearer' },
    });
    const other = await signUp(svc);
    const id = made.body.id as string;
    t.same((await http.get('/api/secret-bindings', { token: other.key })).body.data, []);
    const upd = await patch(`/api/secret-bindings/${id}`, { host: 'evil.example.com' }, other.key);
    t.match(upd, { status: 404, body: { error: 'not_found' } });
    t.notOk('broker' in upd.body, 'an ordinary not-found');
    t.match(await http.delete(`/api/secret-bindings/${id}`, { token: other.key }), { status: 404 });
    const same = await http.post('/api/secret-bindings', {
      token: other.key,
      body: { secret_name: 'MINE', host: 'api.example.com', shape: 'bearer' },
    });
    t.equal(same.status, 201, 'the same name and host in another account is no conflict');
    t.same(await list(), [made.body], 'untouched');
    await http.delete(`/api/secret-bindings/${id}`, { token });
  });

  t.test('a standard-scope key is 403 on every binding route; it reads the egress log', async (t) => {
    const made = await http.post('/api/secret-bindings', {
      token,
      body: { secret_name: 'STD', host: 'api.example.com', shape: 'bearer' },
    });
    const std = (await http.post('/api/auth/api-keys', { token, body: { scope: 'standard' } })).body.key as string;
    const id = made.body.id as string;
    const calls: [string, string, unknown][] = [
      ['GET', '/api/secret-bindings', undefined],
      ['GET', '/api/secret-bindings/presets', undefined],
      ['POST', '/api/secret-bindings', { secret_name: 'X', host: 'x.example.com', shape: 'bearer' }],
      ['PATCH', `/api/secret-bindings/${id}`, { host: 'evil.example.com' }],
      ['DELETE', `/api/secret-bindings/${id}`, undefined],
    ];
    for (const [method, path, body] of calls) {
      const res = await http.call(method, path, { token: std, body });
      t.equal(res.status, 403, `${method} ${path}`);
      t.equal(res.body.error, 'forbidden');
      t.match(res.body.message, /full-scope/);
    }
    t.same(await list(), [made.body], 'untouched');
    const conversation = await conversationOf(svc, me.accountId);
    const egress = await http.get(`/api/conversations/${conversation}/egress`, { token: std });
    t.equal(egress.status, 200, 'the egress log needs any user key');
    await http.delete(`/api/secret-bindings/${id}`, { token });
  });

  t.test("a conversation's sandbox token cannot reach the bindings or the egress log", async (t) => {
    const conversation = await conversationOf(svc, me.accountId);
    const sandbox = (await issueSandboxToken(svc.db.sql, me.accountId, conversation)).key;
    t.equal((await http.get('/api/auth/me', { token: sandbox })).status, 200, 'the token itself works');
    const calls: [string, string, unknown][] = [
      ['GET', '/api/secret-bindings', undefined],
      ['GET', '/api/secret-bindings/presets', undefined],
      ['POST', '/api/secret-bindings', { secret_name: 'X', host: 'x.example.com', shape: 'bearer' }],
      ['PATCH', '/api/secret-bindings/sbd_x', { host: 'evil.example.com' }],
      ['DELETE', '/api/secret-bindings/sbd_x', undefined],
      ['GET', `/api/conversations/${conversation}/egress`, undefined],
    ];
    for (const [method, path, body] of calls) {
      const res = await http.call(method, path, { token: sandbox, body });
      t.equal(res.status, 403, `${method} ${path}`);
      t.equal(res.body.error, 'forbidden');
    }
    t.same(await list(), []);
  });

  t.test("the egress log pages newest first with limit and before; another account's is 404", async (t) => {
    const conversation = await conversationOf(svc, me.accountId);
    const other = await conversationOf(svc, me.accountId);
    const rows = Array.from({ length: 5 }, (_, i) =>
      row(
        me.accountId,
        conversation,
        i,
        i === 3
          ? {
              host: 'evil.example.com',
              refused: true,
              reason: 'placeholder sent to a host it is not bound to',
              status: null,
              latencyMs: null,
              method: 'POST',
            }
          : {},
      ),
    );
    t.equal(await egressLog.insertEgressRows(svc.db.sql, rows), 5, 'many rows in one call');
    t.equal(await egressLog.insertEgressRows(svc.db.sql, [row(me.accountId, other, 9)]), 1);
    t.equal(await egressLog.insertEgressRows(svc.db.sql, []), 0);

    const all = await http.get(`/api/conversations/${conversation}/egress`, { token });
    t.equal(all.status, 200, all.text);
    t.same(all.body.meta, { limit: 100, has_more: false, next_cursor: null });
    t.same(
      all.body.data.map((r: { latency_ms: number | null }) => r.latency_ms),
      [44, null, 42, 41, 40],
      'newest first, only this conversation',
    );
    t.same(Object.keys(all.body.data[0]).sort(), [
      'at',
      'binding_id',
      'host',
      'id',
      'latency_ms',
      'method',
      'port',
      'reason',
      'refused',
      'status',
    ]);
    t.same(all.body.data[1], {
      id: all.body.data[1].id,
      at: '2026-11-23T06:00:03.000Z',
      host: 'evil.example.com',
      port: 443,
      method: 'POST',
      binding_id: null,
      status: null,
      latency_ms: null,
      refused: true,
      reason: 'placeholder sent to a host it is not bound to',
    });

    const first = await http.get(`/api/conversations/${conversation}/egress?limit=2`, { token });
    t.equal(first.body.data.length, 2);
    t.same(first.body.meta, { limit: 2, has_more: true, next_cursor: first.body.data[1].id });
    const second = await http.get(
      `/api/conversations/${conversation}/egress?limit=2&before=${first.body.meta.next_cursor}`,
      { token },
    );
    t.same(
      second.body.data.map((r: { id: number }) => r.id),
      all.body.data.slice(2, 4).map((r: { id: number }) => r.id),
    );
    t.equal(second.body.meta.has_more, true);
    const last = await http.get(
      `/api/conversations/${conversation}/egress?limit=2&before=${second.body.meta.next_cursor}`,
      { token },
    );
    t.same(last.body.data, all.body.data.slice(4));
    t.same(last.body.meta, { limit: 2, has_more: false, next_cursor: null });

    t.equal((await http.get(`/api/conversations/${conversation}/egress?limit=0`, { token })).status, 400);
    t.equal((await http.get(`/api/conversations/${conversation}/egress?limit=1001`, { token })).status, 400);
    t.equal((await http.get(`/api/conversations/${conversation}/egress?before=x`, { token })).status, 400);

    const stranger = await signUp(svc);
    const theirs = await http.get(`/api/conversations/${conversation}/egress`, { token: stranger.key });
    t.match(theirs, { status: 404, body: { error: 'not_found' } });
    t.notOk('broker' in theirs.body);
    t.equal((await http.get('/api/conversations/cnv_unknown/egress', { token })).status, 404);
  });

  t.test("the sweep removes an ended conversation's rows past the retention, and keeps a live one's", async (t) => {
    const sql = svc.db.sql;
    const ended = await conversationOf(svc, me.accountId);
    const endedRecently = await conversationOf(svc, me.accountId);
    const live = await conversationOf(svc, me.accountId);
    const old = { at: new Date(Date.now() - 100 * 3_600_000) };
    await egressLog.insertEgressRows(sql, [
      row(me.accountId, ended, 1, old),
      row(me.accountId, ended, 2),
      row(me.accountId, endedRecently, 1, old),
      row(me.accountId, live, 1, old),
    ]);
    for (const id of [ended, endedRecently]) await conversations.terminate(sql, me.accountId, id, () => []);
    // Ended 73 hours ago: past the default retention (72 hours).
    await sql`UPDATE conversations SET last_active_at = now() - interval '73 hours' WHERE id = ${ended}`;
    await sql`UPDATE conversations SET last_active_at = now() - interval '71 hours' WHERE id = ${endedRecently}`;
    const count = async (id: string) =>
      (await http.get(`/api/conversations/${id}/egress`, { token })).body.data.length as number;

    const sweeper = new EgressLogSweeper(
      { sql, logger: createLogger('silent') },
      { retentionHours: svc.config.BROKER_LOG_RETENTION_HOURS },
    );
    t.equal(await sweeper.pass(), 2, "the ended conversation's two rows");
    t.equal(await count(ended), 0, 'its log is gone, the conversation still answers');
    t.equal(await count(endedRecently), 1, 'ended within the retention: kept');
    t.equal(await count(live), 1, 'a live conversation keeps its rows, old as they are');
    t.equal(await sweeper.pass(), 0, 'a second pass has nothing to do');
  });
});

t.test('with EGRESS_BROKER=off every broker route is 404 broker "disabled" and /me is not brokered', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded', env: { EGRESS_BROKER: 'off' } });
  const { http } = svc;
  const me = await signUp(svc);
  const token = me.key;
  t.equal((await http.get('/api/auth/me', { token })).body.brokered, false);
  const conversation = await conversationOf(svc, me.accountId);
  const calls: [string, string, unknown][] = [
    ['GET', '/api/secret-bindings', undefined],
    ['GET', '/api/secret-bindings/presets', undefined],
    ['POST', '/api/secret-bindings', { secret_name: 'X', host: 'x.example.com', shape: 'bearer' }],
    ['POST', '/api/secret-bindings', { nonsense: true }],
    ['PATCH', '/api/secret-bindings/sbd_x', { host: 'y.example.com' }],
    ['DELETE', '/api/secret-bindings/sbd_x', undefined],
    ['GET', `/api/conversations/${conversation}/egress`, undefined],
  ];
  for (const [method, path, body] of calls) {
    const res = await http.call(method, path, { token, body });
    t.equal(res.status, 404, `${method} ${path}`);
    t.equal(res.body.error, 'not_found');
    t.equal(res.body.broker, 'disabled', `${method} ${path} says the broker is disabled`);
  }
  t.equal((await svc.db.sql`SELECT count(*)::int AS n FROM secret_bindings`)[0]?.n, 0, 'nothing was created');
  const unauthenticated = await http.get('/api/secret-bindings');
  t.equal(unauthenticated.status, 401, 'a caller must still authenticate first');
});
