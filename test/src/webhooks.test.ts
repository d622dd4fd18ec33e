import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { verifyWebhookSignature } from '@svc/core';
import { loadConfig } from '@svc/gateway';
import postgres from 'postgres';
import t from 'tap';
import { signUp, startTestService } from './harness.ts';
import { until } from './until.ts';

t.test('webhook endpoints', async (t) => {
  const svc = await startTestService(t, { env: { WEBHOOK_INTERVAL_MS: '0' } });
  const { http } = svc;
  const me = await signUp(svc);
  const token = me.key;
  const patch = (path: string, body: unknown, tok = token) => http.call('PATCH', path, { token: tok, body });
  const audit = async (prefix: string) =>
    (await http.get(`/api/audit?action_prefix=${prefix}`, { token })).body.data as {
      action: string;
      resource_id: string;
      metadata: Record<string, unknown>;
    }[];

  t.test('create shows the secret once; list and get never do', async (t) => {
    const made = await http.post('/api/webhooks', {
      token,
      body: { url: 'https://hooks.example.com/svc?key=abc', description: 'ci' },
    });
    t.equal(made.status, 201, made.text);
    t.match(made.body, {
      url: 'https://hooks.example.com/svc?key=abc',
      description: 'ci',
      status: 'active',
      disabled_reason: null,
    });
    t.same(
      made.body.event_types,
      ['conversation.turn.done', 'conversation.turn.failed', 'conversation.provision.failed'],
      'the default set when event_types is absent',
    );
    t.match(made.body.secret, /^whsec_[A-Za-z0-9_-]{43}$/);
    const list = await http.get('/api/webhooks', { token });
    t.same(
      list.body.data.map((e: { id: string }) => e.id),
      [made.body.id],
    );
    t.notOk('secret' in list.body.data[0], 'no secret in the list');
    t.notMatch(list.text, made.body.secret);
    const one = await http.get(`/api/webhooks/${made.body.id}`, { token });
    t.equal(one.status, 200);
    t.notMatch(one.text, made.body.secret, 'nor in the endpoint itself');

    const rotated = await http.post(`/api/webhooks/${made.body.id}/rotate-secret`, { token });
    t.equal(rotated.status, 200);
    t.match(rotated.body.secret, /^whsec_/);
    t.not(rotated.body.secret, made.body.secret, 'a new secret');

    const rows = await audit('webhook.');
    t.same(
      rows.map((r) => r.action),
      ['webhook.secret_rotated', 'webhook.created'],
    );
    t.same(rows[1]?.metadata, {
      url: 'https://hooks.example.com/svc',
      event_types: ['conversation.turn.done', 'conversation.turn.failed', 'conversation.provision.failed'],
    });
    const trail = (await http.get('/api/audit', { token })).text;
    t.notMatch(trail, made.body.secret, 'the audit trail never holds a secret');
    t.notMatch(trail, rotated.body.secret);
    t.notMatch(trail, 'key=abc', 'nor the query of the URL');
    t.equal((await http.delete(`/api/webhooks/${made.body.id}`, { token })).status, 204);
  });

  t.test('event_types take exact types, one stage, or *; a mistyped type is 422 naming it', async (t) => {
    const ok = await http.post('/api/webhooks', {
      token,
      body: { url: 'https://a.example.com/', event_types: ['conversation.turn.*', '*', 'conversation.session.done'] },
    });
    t.equal(ok.status, 201, ok.text);
    t.same(ok.body.event_types, ['conversation.turn.*', '*', 'conversation.session.done']);
    const bad = await http.post('/api/webhooks', {
      token,
      body: { url: 'https://a.example.com/', event_types: ['conversation.turn.done', 'conversation.trun.done'] },
    });
    t.equal(bad.status, 422);
    t.equal(bad.body.error, 'validation_failed');
    t.match(bad.body.details.event_types, [/conversation\.trun\.done is not an event type/]);
    const stage = await patch(`/api/webhooks/${ok.body.id}`, { event_types: ['conversation.nope.*'] });
    t.equal(stage.status, 422);
    t.match(stage.body.details.event_types, [/no stage named nope/]);
    const state = await patch(`/api/webhooks/${ok.body.id}`, { event_types: ['conversation.model.done'] });
    t.equal(state.status, 422, 'model has no done state');
    t.equal((await http.get(`/api/webhooks/${ok.body.id}`, { token })).body.event_types.length, 3, 'nothing saved');
    await http.delete(`/api/webhooks/${ok.body.id}`, { token });
  });

  t.test('URL rules: https only, no credentials, no private address literal', async (t) => {
    const cases: [string, RegExp][] = [
      ['http://hooks.example.com/', /must start with https:\/\//],
      ['ftp://hooks.example.com/', /must start with https:\/\//],
      ['https://user:pw@hooks.example.com/', /must not carry credentials/],
      ['https://127.0.0.1/', /127\.0\.0\.1 is loopback/],
      ['https://[::1]/', /::1 is loopback/],
      ['https://169.254.169.254/latest', /link-local/],
      ['not a url', /is not a URL/],
    ];
    for (const [url, reason] of cases) {
      const res = await http.post('/api/webhooks', { token, body: { url } });
      t.equal(res.status, 422, url);
      t.match(res.body.details?.url, [reason], `${url}: ${reason}`);
      t.notMatch(res.text, 'pw@', 'credentials are not echoed back');
    }
    t.same((await http.get('/api/webhooks', { token })).body.data, [], 'none was saved');
  });

  t.test('with WEBHOOK_ALLOW_HTTP and WEBHOOK_ALLOW_CIDRS the service delivers to a local receiver', async (t) => {
    const received: { path: string; headers: IncomingHttpHeaders; body: string }[] = [];
    const receiver = createServer((req, res) => {
      let body = '';
      req.on('data', (c) => {
        body += c;
      });
      req.on('end', () => {
        received.push({ path: req.url ?? '/', headers: req.headers, body });
        // `/never` is a receiver that takes the request and never answers.
        if (req.url !== '/never') res.end('got it');
      });
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    t.teardown(() => {
      receiver.closeAllConnections();
      receiver.close();
    });
    const port = (receiver.address() as AddressInfo).port;
    // The delivery worker polls once an hour: whatever arrives during the test was sent because
    // writing its job woke the worker (the test route, the consumer), never by the poll.
    const other = await startTestService(t, {
      backend: 'embedded',
      env: {
        WEBHOOK_INTERVAL_MS: '3600000',
        WEBHOOK_CONSUMER_SWEEP_MS: '100',
        WEBHOOK_TIMEOUT_MS: '700',
        WEBHOOK_ALLOW_HTTP: 'true',
        WEBHOOK_ALLOW_CIDRS: '127.0.0.1/32',
      },
    });
    const them = await signUp(other);
    const made = await other.http.post('/api/webhooks', {
      token: them.key,
      body: { url: `http://127.0.0.1:${port}/hook` },
    });
    t.equal(made.status, 201, made.text);
    const creds = await other.http.post('/api/webhooks', {
      token: them.key,
      body: { url: `http://u:p@127.0.0.1:${port}/hook` },
    });
    t.equal(creds.status, 422, 'credentials are still refused');
    t.match(creds.body.details.url, [/credentials/]);
    const lan = await other.http.post('/api/webhooks', { token: them.key, body: { url: 'http://10.0.0.1/hook' } });
    t.match(lan.body.details?.url, [/10\.0\.0\.1 is private/], 'a range not listed is still refused');

    const queued = await other.http.post(`/api/webhooks/${made.body.id}/test`, { token: them.key });
    t.equal(queued.status, 202);
    await until('the service to deliver the test', () => received.length > 0);
    const [r] = received;
    t.match(JSON.parse(r?.body ?? '{}'), { id: queued.body.event, type: 'webhook.test' });
    t.same(
      verifyWebhookSignature({
        header: r?.headers['svc-signature'] as string,
        body: r?.body ?? '',
        secret: made.body.secret,
      }).ok,
      true,
    );
    const listed = await until('the attempt to be recorded', async () => {
      const rows = (await other.http.get(`/api/webhooks/${made.body.id}/deliveries`, { token: them.key })).body.data;
      return rows.length > 0 && rows;
    });
    t.match(listed, [{ event: queued.body.event, type: 'webhook.test', try: 1, result: 200, detail: 'got it' }]);

    // A stage event appended to the log: the consumer writes its job and wakes the worker.
    const staged = await other.http.post('/api/webhooks', {
      token: them.key,
      body: { url: `http://127.0.0.1:${port}/staged`, event_types: ['conversation.session.done'] },
    });
    t.equal(staged.status, 201, staged.text);
    // Appended once the consumer reads the account (its sweep lists it), so the event is after the group's start.
    const consumed = async () =>
      (await other.db.sql`SELECT 1 FROM webhook_consumer_marks WHERE account_id = ${them.accountId}`).length > 0;
    await until('the consumer to read the account', consumed);
    const appended = await other.appendEvents({
      tenant: them.accountId,
      producer: 'webhook-wake',
      seq: 1,
      events: [{ conversationId: 'cnv_wake', kind: 'stage', stream: 'stage', stage: 'session', state: 'done' }],
    });
    const [event] = appended.events;
    const arrived = await until('the stage event to reach the receiver', () =>
      received.find((r) => r.path === '/staged'),
    );
    t.match(JSON.parse(arrived.body), { id: String(event?.id), type: 'conversation.session.done' });

    // A receiver that never answers: a failed attempt after WEBHOOK_TIMEOUT_MS that says so.
    const silent = await other.http.post('/api/webhooks', {
      token: them.key,
      body: { url: `http://127.0.0.1:${port}/never` },
    });
    await other.http.post(`/api/webhooks/${silent.body.id}/test`, { token: them.key });
    const timedOut = await until('the unanswered attempt to be recorded', async () => {
      const rows = (await other.http.get(`/api/webhooks/${silent.body.id}/deliveries`, { token: them.key })).body.data;
      return rows.length > 0 && rows;
    });
    t.match(timedOut, [{ type: 'webhook.test', try: 1, result: null, detail: 'no answer within 0.7 s' }]);
    t.ok(
      received.some((r) => r.path === '/never'),
      'the request did reach the receiver, which never answered',
    );
  });

  t.test(
    'a delivery under way at shutdown is recorded before the database closes',
    { skip: !process.env.TEST_DATABASE_URL && 'needs the Postgres of the run' },
    async (t) => {
      let answer: ((status: number) => void) | undefined;
      const receiver = createServer((req, res) => {
        req.resume();
        answer = (status) => res.writeHead(status).end();
      });
      await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
      t.teardown(() => {
        receiver.closeAllConnections();
        receiver.close();
      });
      const port = (receiver.address() as AddressInfo).port;
      const other = await startTestService(t, {
        backend: 'postgres+redis',
        env: { WEBHOOK_INTERVAL_MS: '50', WEBHOOK_ALLOW_HTTP: 'true', WEBHOOK_ALLOW_CIDRS: '127.0.0.1/32' },
      });
      const them = await signUp(other);
      const made = await other.http.post('/api/webhooks', {
        token: them.key,
        body: { url: `http://127.0.0.1:${port}/` },
      });
      await other.http.post(`/api/webhooks/${made.body.id}/test`, { token: them.key });
      await until('the receiver to hold the delivery', () => answer !== undefined);
      const closing = other.close();
      // The answer comes while the service is shutting down.
      await new Promise((r) => setTimeout(r, 500));
      answer?.(200);
      await closing;
      const sql = postgres(other.config.DATABASE_URL as string, { max: 1, onnotice: () => {} });
      t.teardown(() => sql.end());
      const rows = await sql`SELECT attempt, status_code FROM webhook_deliveries WHERE endpoint_id = ${made.body.id}`;
      t.same([...rows], [{ attempt: 1, status_code: 200 }], 'the attempt was recorded, so it is not sent again');
    },
  );

  t.test('every webhook route needs a full-scope key: a standard key is 403', async (t) => {
    const made = await http.post('/api/webhooks', { token, body: { url: 'https://b.example.com/' } });
    const std = (await http.post('/api/auth/api-keys', { token, body: { scope: 'standard' } })).body.key as string;
    const id = made.body.id as string;
    const calls: [string, string][] = [
      ['GET', '/api/webhooks'],
      ['POST', '/api/webhooks'],
      ['GET', `/api/webhooks/${id}`],
      ['PATCH', `/api/webhooks/${id}`],
      ['DELETE', `/api/webhooks/${id}`],
      ['POST', `/api/webhooks/${id}/rotate-secret`],
      ['POST', `/api/webhooks/${id}/test`],
      ['POST', `/api/webhooks/${id}/resume`],
      ['GET', `/api/webhooks/${id}/deliveries`],
      ['POST', `/api/webhooks/${id}/deliveries/whd_x/redeliver`],
    ];
    for (const [method, path] of calls) {
      const res = await http.call(method, path, {
        token: std,
        body: method === 'POST' || method === 'PATCH' ? { url: 'https://c.example.com/' } : undefined,
      });
      t.equal(res.status, 403, `${method} ${path}`);
      t.equal(res.body.error, 'forbidden');
      t.match(res.body.message, /full-scope/);
    }
    t.equal((await http.get(`/api/webhooks/${id}`, { token })).body.url, 'https://b.example.com/', 'untouched');
    await http.delete(`/api/webhooks/${id}`, { token });
  });

  t.test("another tenant's endpoint is 404 on every route", async (t) => {
    const made = await http.post('/api/webhooks', { token, body: { url: 'https://d.example.com/' } });
    const other = await signUp(svc);
    const id = made.body.id as string;
    for (const [method, path] of [
      ['GET', `/api/webhooks/${id}`],
      ['PATCH', `/api/webhooks/${id}`],
      ['DELETE', `/api/webhooks/${id}`],
      ['POST', `/api/webhooks/${id}/rotate-secret`],
      ['POST', `/api/webhooks/${id}/test`],
      ['POST', `/api/webhooks/${id}/resume`],
      ['GET', `/api/webhooks/${id}/deliveries`],
    ] as const) {
      const res = await http.call(method, path, {
        token: other.key,
        body: method === 'PATCH' ? { description: 'x' } : undefined,
      });
      t.equal(res.status, 404, `${method} ${path}`);
      t.equal(res.body.error, 'not_found');
    }
    t.same((await http.get('/api/webhooks', { token: other.key })).body.data, []);
    t.equal((await http.get(`/api/webhooks/${id}`, { token })).body.description, '', 'untouched');
    await http.delete(`/api/webhooks/${id}`, { token });
  });

  t.test('PATCH writes the fields given and is audited by field names', async (t) => {
    const made = await http.post('/api/webhooks', { token, body: { url: 'https://e.example.com/' } });
    const id = made.body.id as string;
    const res = await patch(`/api/webhooks/${id}`, { url: 'https://f.example.com/new', event_types: ['*'] });
    t.equal(res.status, 200, res.text);
    t.match(res.body, { url: 'https://f.example.com/new', event_types: ['*'], status: 'active' });
    const off = await patch(`/api/webhooks/${id}`, { status: 'disabled' });
    t.match(off.body, { status: 'disabled', disabled_reason: 'disabled through the API' });
    t.ok(off.body.disabled_at);
    const on = await patch(`/api/webhooks/${id}`, { status: 'active' });
    t.match(on.body, { status: 'active', disabled_reason: null, disabled_at: null });
    const rows = (await audit('webhook.')).filter((r) => r.resource_id === id);
    t.same(
      rows.map((r) => [r.action, r.metadata.fields ?? r.metadata.via]),
      [
        ['webhook.resumed', 'patch'],
        ['webhook.updated', ['status']],
        ['webhook.updated', ['status']],
        ['webhook.updated', ['event_types', 'url']],
        ['webhook.created', undefined],
      ],
    );
    await http.delete(`/api/webhooks/${id}`, { token });
    const deleted = await audit('webhook.deleted');
    t.equal(deleted[0]?.resource_id, id);
    t.equal((await http.get(`/api/webhooks/${id}`, { token })).status, 404);
  });

  t.test('resume on an active endpoint also resets the failure count and is audited', async (t) => {
    const made = await http.post('/api/webhooks', { token, body: { url: 'https://g.example.com/' } });
    const id = made.body.id as string;
    await svc.db.sql`UPDATE webhook_endpoints SET failure_streak = 3 WHERE id = ${id}`;
    const res = await http.post(`/api/webhooks/${id}/resume`, { token });
    t.equal(res.status, 200, res.text);
    t.match(res.body, { id, status: 'active', disabled_reason: null });
    const [row] = await svc.db.sql<{ failure_streak: number }[]>`
      SELECT failure_streak FROM webhook_endpoints WHERE id = ${id}`;
    t.equal(row?.failure_streak, 0, 'the count starts again from 0');
    t.match(
      (await audit('webhook.resumed')).filter((r) => r.resource_id === id),
      [{ metadata: { via: 'resume' } }],
    );
    await http.delete(`/api/webhooks/${id}`, { token });
  });

  t.test('the signing secret is stored as ciphertext: the row never holds the plaintext', async (t) => {
    const made = await http.post('/api/webhooks', { token, body: { url: 'https://h.example.com/' } });
    const id = made.body.id as string;
    const rotated = (await http.post(`/api/webhooks/${id}/rotate-secret`, { token })).body.secret as string;
    const [row] = await svc.db.sql<Record<string, unknown>[]>`SELECT * FROM webhook_endpoints WHERE id = ${id}`;
    const stored = Buffer.from(row?.secret_ciphertext as Uint8Array);
    t.ok(stored.length > rotated.length, 'a ciphertext with its nonce and tag');
    const dump = JSON.stringify(row, (_k, v) =>
      v instanceof Uint8Array || (v && v.type === 'Buffer') ? Buffer.from(v.data ?? v).toString('latin1') : v,
    );
    for (const secret of [made.body.secret as string, rotated]) {
      const raw = secret.slice('whsec_'.length);
      t.notOk(stored.includes(secret) || stored.includes(raw), 'not in the secret column');
      t.notOk(stored.toString('base64').includes(raw) || stored.toString('hex').includes(raw), 'nor encoded');
      t.notOk(dump.includes(raw), 'nor in any other column of the row');
    }
    await http.delete(`/api/webhooks/${id}`, { token });
  });

  t.test('deliveries: limit defaults to 50 and goes up to 200; beyond is 400 invalid_request', async (t) => {
    const made = await http.post('/api/webhooks', { token, body: { url: 'https://i.example.com/' } });
    const id = made.body.id as string;
    // 201 recorded attempts of one event, written as the delivery worker records them.
    await svc.db.sql`
      INSERT INTO webhook_jobs (id, account_id, endpoint_id, event_id, event_type, event_at, data, max_attempts,
                                next_attempt_at, state, attempts)
      VALUES ('whj_limits', ${me.accountId}, ${id}, 'test_limits', 'webhook.test', now(), '{}', 8, now(), 'failed', 8)`;
    await svc.db.sql`
      INSERT INTO webhook_deliveries (id, account_id, endpoint_id, job_id, attempt, status_code, duration_ms, detail,
                                      created_at)
      SELECT 'whd_limits_' || lpad(n::text, 4, '0'), ${me.accountId}, ${id}, 'whj_limits', n, 500, 3, 'down', now()
      FROM generate_series(1, 201) AS n`;
    const page = async (query: string) => {
      const res = await http.get(`/api/webhooks/${id}/deliveries${query}`, { token });
      t.equal(res.status, 200, `${query}: ${res.text}`);
      return res.body as { data: { id: string; try: number }[]; meta: { limit: number; has_more: boolean } };
    };
    const first = await page('');
    t.equal(first.data.length, 50, 'without limit: 50');
    t.same(first.meta, { limit: 50, has_more: true, next_cursor: 'whd_limits_0152' });
    t.match(first.data[0], { id: 'whd_limits_0201', try: 201 }, 'newest first');
    const most = await page('?limit=200');
    t.equal(most.data.length, 200, 'limit=200: 200');
    t.match(most.meta, { limit: 200, has_more: true });
    t.same(
      (await page(`?limit=200&before=${most.data.at(-1)?.id}`)).data.map((d) => d.id),
      ['whd_limits_0001'],
    );
    for (const bad of ['limit=201', 'limit=0', 'limit=-5', 'limit=ten', 'limit=2.5']) {
      const res = await http.get(`/api/webhooks/${id}/deliveries?${bad}`, { token });
      t.equal(res.status, 400, bad);
      t.equal(res.body.error, 'invalid_request', bad);
      t.match(res.body.message, /limit/, `${bad}: the message names the parameter`);
    }
    await http.delete(`/api/webhooks/${id}`, { token });
  });
});

t.test('a WEBHOOK_ALLOW_CIDRS entry that is not a range stops the start, naming the variable', async (t) => {
  t.throws(
    () => loadConfig({ WEBHOOK_ALLOW_CIDRS: '10.0.0.0/8,10.1.0.0/33' }),
    /WEBHOOK_ALLOW_CIDRS.*prefix must be 0 to 32/s,
  );
  t.throws(() => loadConfig({ WEBHOOK_ALLOW_CIDRS: 'intranet' }), /WEBHOOK_ALLOW_CIDRS.*not an address or a CIDR/s);
  t.same(loadConfig({ WEBHOOK_ALLOW_CIDRS: '10.0.0.0/8, fd00::/8' }).WEBHOOK_ALLOW_CIDRS, ['10.0.0.0/8', 'fd00::/8']);
  t.equal(loadConfig({}).WEBHOOK_ALLOW_HTTP, false, 'https only unless asked');
});

t.test('a webhook request times out after 10 s unless WEBHOOK_TIMEOUT_MS says otherwise', async (t) => {
  t.equal(loadConfig({}).WEBHOOK_TIMEOUT_MS, 10_000, 'SPEC Limits: 10 s');
  t.equal(loadConfig({ WEBHOOK_TIMEOUT_MS: '2500' }).WEBHOOK_TIMEOUT_MS, 2500);
  t.throws(() => loadConfig({ WEBHOOK_TIMEOUT_MS: 'soon' }), /WEBHOOK_TIMEOUT_MS/);
  t.throws(() => loadConfig({ WEBHOOK_TIMEOUT_MS: '0' }), /WEBHOOK_TIMEOUT_MS/);
});
