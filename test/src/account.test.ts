import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { accounts } from '@svc/db';
import { Redis } from 'ioredis';
import t from 'tap';
import { startFakeProvider } from './fakes/inference-provider.ts';
import { backends, PASSWORD, signUp, startTestService, type TestService } from './harness.ts';
import { checkPaging } from './paging.ts';
import { alive, claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';

t.test('inference credentials', async (t) => {
  const provider = await startFakeProvider();
  t.teardown(() => provider.close());
  const svc = await startTestService(t, {
    env: {
      ANTHROPIC_BASE_URL: provider.url,
      OPENAI_BASE_URL: provider.url,
      GEMINI_BASE_URL: provider.url,
      PROVIDER_CHECK_TIMEOUT_MS: '500',
    },
  });
  const { http } = svc;
  const { key, accountId } = await signUp(svc);

  t.test('a new account has none set', async (t) => {
    const list = await http.get('/api/account/inference-credentials', { token: key });
    t.equal(list.status, 200);
    t.same(
      list.body.data.map((c: { provider: string; set: boolean }) => [c.provider, c.set]),
      [
        ['anthropic_api_key', false],
        ['claude_code_oauth_token', false],
        ['openai_api_key', false],
        ['gemini_api_key', false],
      ],
    );
  });

  for (const name of ['anthropic_api_key', 'claude_code_oauth_token', 'openai_api_key', 'gemini_api_key']) {
    t.test(`${name}: validate pings the provider; a rejected value is 422 invalid and not stored`, async (t) => {
      const bad = await http.put(`/api/account/inference-credentials/${name}`, {
        token: key,
        body: { value: 'bad-credential-1234', validate: true },
      });
      t.equal(bad.status, 422);
      t.equal(bad.body.error, 'invalid');
      t.ok([400, 401].includes(bad.body.provider_status), `provider_status ${bad.body.provider_status}`);
      const list1 = await http.get('/api/account/inference-credentials', { token: key });
      t.equal(list1.body.data.find((c: { provider: string }) => c.provider === name).set, false);

      const good = await http.put(`/api/account/inference-credentials/${name}`, {
        token: key,
        body: { value: 'good-credential-5678', validate: true },
      });
      t.equal(good.status, 200);
      t.same({ provider: good.body.provider, set: good.body.set }, { provider: name, set: true });
      t.notMatch(good.text, /good-credential/, 'the value is never echoed');
    });
  }

  t.test('validate: false stores without a ping; the value is encrypted at rest', async (t) => {
    const before = provider.seen.length;
    const res = await http.put('/api/account/inference-credentials/openai_api_key', {
      token: key,
      body: { value: 'sk-unchecked-value-0001', validate: false },
    });
    t.equal(res.status, 200);
    t.equal(provider.seen.length, before, 'no request went to the provider');
    const rows = await svc.db.sql<{ ciphertext: Uint8Array }[]>`
      SELECT ciphertext FROM inference_credentials WHERE account_id = ${accountId} AND provider = 'openai_api_key'`;
    t.notMatch(Buffer.from(rows[0]!.ciphertext).toString('latin1'), /sk-unchecked/, 'ciphertext, not plaintext');
    const { revealCredential } = await import('../../gateway/src/services/inference-credentials.ts');
    t.equal(
      await revealCredential({ sql: svc.db.sql, keyring: svc.keyring }, accountId, 'openai_api_key'),
      'sk-unchecked-value-0001',
    );
  });

  t.test('provider errors: 502 network, 504 timeout, blank and unknown are 422 invalid', async (t) => {
    const boom = await http.put('/api/account/inference-credentials/anthropic_api_key', {
      token: key,
      body: { value: 'boom-credential', validate: true },
    });
    t.equal(boom.status, 502);
    t.equal(boom.body.error, 'network');
    const slow = await http.put('/api/account/inference-credentials/anthropic_api_key', {
      token: key,
      body: { value: 'slow-credential', validate: true },
    });
    t.equal(slow.status, 504);
    t.equal(slow.body.error, 'timeout');
    const blank = await http.put('/api/account/inference-credentials/anthropic_api_key', {
      token: key,
      body: { value: '   ', validate: false },
    });
    t.equal(blank.status, 422);
    t.equal(blank.body.error, 'invalid');
    const unknown = await http.put('/api/account/inference-credentials/mistral_key', {
      token: key,
      body: { value: 'x', validate: false },
    });
    t.equal(unknown.status, 422);
    t.equal(unknown.body.error, 'invalid');
    const missing = await http.put('/api/account/inference-credentials/anthropic_api_key', { token: key, body: {} });
    t.equal(missing.status, 422);
    t.equal(missing.body.error, 'validation_failed');
  });

  t.test('delete clears it', async (t) => {
    const del = await http.delete('/api/account/inference-credentials/openai_api_key', { token: key });
    t.equal(del.status, 204);
    const list = await http.get('/api/account/inference-credentials', { token: key });
    t.equal(list.body.data.find((c: { provider: string }) => c.provider === 'openai_api_key').set, false);
  });

  t.test("one tenant never sees another's credentials", async (t) => {
    const other = await signUp(svc);
    const list = await http.get('/api/account/inference-credentials', { token: other.key });
    t.ok(list.body.data.every((c: { set: boolean }) => !c.set));
  });
});

t.test('audit trail', async (t) => {
  const svc = await startTestService(t);
  const { http } = svc;
  const { key } = await signUp(svc);
  await http.post('/api/auth/api-keys', { token: key, body: { name: 'one' } });
  const two = await http.post('/api/auth/api-keys', { token: key, body: { name: 'two' } });
  await http.delete(`/api/auth/api-keys/${two.body.id}`, { token: key });
  await http.post('/api/account/onboarding/complete', { token: key });

  t.test('every mutating route wrote a row, newest first, with the actor and request IP', async (t) => {
    const res = await http.get('/api/audit', { token: key });
    t.equal(res.status, 200);
    const actions = res.body.data.map((r: { action: string }) => r.action);
    t.same(actions.slice(0, 4), [
      'account.onboarding_completed',
      'api_key.revoked',
      'api_key.created',
      'api_key.created',
    ]);
    t.ok(actions.includes('account.registered'));
    t.ok(actions.includes('account.verified'));
    const revoked = res.body.data[1];
    t.equal(revoked.actor, 'api');
    t.equal(revoked.resource_type, 'api_key');
    t.equal(revoked.resource_id, two.body.id);
    t.equal(revoked.request_ip, '127.0.0.1', 'the edge passed the client address');
    t.notMatch(res.text, two.body.key, 'no secret in the trail');
  });

  t.test('limit and before page backwards through meta.next_cursor', async (t) => {
    const first = await http.get('/api/audit?limit=2', { token: key });
    t.equal(first.body.data.length, 2);
    t.equal(first.body.meta.has_more, true);
    const second = await http.get(`/api/audit?limit=2&before=${first.body.meta.next_cursor}`, { token: key });
    t.equal(second.body.data.length, 2);
    t.ok(BigInt(second.body.data[0].id) < BigInt(first.body.data[1].id), 'older rows');
    const all = await http.get('/api/audit?limit=500', { token: key });
    t.equal(all.body.meta.has_more, false);
    t.equal(all.body.meta.next_cursor, null);
  });

  t.test('action_prefix is a literal prefix and resource_type filters', async (t) => {
    const keys = await http.get('/api/audit?action_prefix=api_key.', { token: key });
    // Three keys made (the password exchange in signUp, 'one', 'two') and one revoked.
    t.equal(keys.body.data.length, 4);
    t.ok(keys.body.data.every((r: { action: string }) => r.action.startsWith('api_key.')));
    const wild = await http.get('/api/audit?action_prefix=api%25', { token: key });
    t.equal(wild.body.data.length, 0, '% is not a wildcard');
    const under = await http.get('/api/audit?action_prefix=api_', { token: key });
    t.equal(under.body.data.length, 4, '_ matches only itself');
    const typed = await http.get('/api/audit?resource_type=account', { token: key });
    t.ok(
      typed.body.data.length >= 2 &&
        typed.body.data.every((r: { resource_type: string }) => r.resource_type === 'account'),
    );
  });

  t.test('since and until bound the window; a malformed one is 400', async (t) => {
    const future = await http.get('/api/audit?since=2999-01-01T00:00:00Z', { token: key });
    t.equal(future.body.data.length, 0);
    const past = await http.get('/api/audit?until=2000-01-01', { token: key });
    t.equal(past.body.data.length, 0);
    const now = await http.get(
      `/api/audit?since=2000-01-01T00:00:00Z&until=${new Date(Date.now() + 60_000).toISOString()}`,
      {
        token: key,
      },
    );
    t.ok(now.body.data.length >= 6);
    for (const bad of ['since=yesterday', 'until=2024-13-45T99:00:00Z', 'since=1']) {
      const r = await http.get(`/api/audit?${bad}`, { token: key });
      t.equal(r.status, 400, bad);
      t.equal(r.body.error, 'invalid_request');
    }
    const limit = await http.get('/api/audit?limit=501', { token: key });
    t.equal(limit.status, 400, 'limit above 500 is refused');
  });

  t.test("another tenant's trail is invisible", async (t) => {
    const other = await signUp(svc);
    const res = await http.get('/api/audit', { token: other.key });
    t.ok(
      res.body.data.every((r: { action: string }) =>
        ['account.registered', 'account.verified', 'api_key.created'].includes(r.action),
      ),
    );
    t.notOk(res.text.includes(two.body.id));
  });
});

for (const backend of backends()) {
  t.test(`audit paging by before returns every row once, newest first, across ids 9 to 10 (${backend})`, async (t) => {
    // A service of its own, so this account's rows are the first ids of the table.
    const svc = await startTestService(t, { backend });
    const { http } = svc;
    const { key } = await signUp(svc);
    const made: string[] = [];
    for (let i = 0; i < 25; i++) {
      await http.post('/api/auth/api-keys', { token: key, body: { name: `k${i}` } });
      made.push(`k${i}`);
    }
    const rows = await checkPaging(
      t,
      {
        http,
        token: key,
        path: '/api/audit?action_prefix=api_key.created',
        cursor: 'before',
        limit: 4,
        key: (r: { id: string; metadata: { name: string } }) => r.metadata.name,
      },
      [...made.toReversed(), 'password exchange'],
    );
    const ids = rows.map((r) => Number(r.id));
    t.ok(Math.min(...ids) < 10 && Math.max(...ids) >= 10, `ids ${Math.min(...ids)} to ${Math.max(...ids)} cross 10`);
  });
}

/** Waits until `ok` holds, up to 20 s; says whether it did. */
async function eventually(ok: () => boolean | Promise<boolean>): Promise<boolean> {
  for (const end = Date.now() + 20_000; Date.now() < end; ) {
    if (await ok()) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return ok();
}

/** The Redis keys under the tenant's hash tag (the live log's), on the service's prefix. */
async function tenantKeys(svc: TestService, accountId: string): Promise<string[]> {
  const redis = new Redis(process.env.TEST_REDIS_URL as string);
  try {
    return await redis.keys(`${svc.config.REDIS_KEY_PREFIX}{t:${accountId}}*`);
  } finally {
    await redis.quit();
  }
}

for (const backend of backends()) {
  t.test(`deleting an account on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      // Heartbeats far apart: what a deletion stops must stop with it, not at the next refused one.
      env: { RUNNER_HEARTBEAT_MS: '10000', RUNNER_GRACE_MS: '30000', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
    });
    const { http } = svc;
    const victim = await signUp(svc);
    const bystander = await signUp(svc);
    // Give the account rows in as many tables as exist today.
    await http.post('/api/auth/api-keys', { token: victim.key, body: {} });
    await http.post('/api/auth/login', { body: { email: victim.email, password: PASSWORD } });
    await http.put('/api/account/inference-credentials/openai_api_key', {
      token: victim.key,
      body: { value: 'sk-to-be-erased-123', validate: false },
    });
    await http.post('/api/auth/forgot', { body: { email: victim.email } });

    // And state outside the database: a sandbox on a connected self-hosted runner, a local
    // sandbox with its runner-agent running, both after a finished turn (so the live log has
    // the tenant's events).
    const token = victim.key;
    const { env, agent: runnerAgent, runner, runnerRow } = await claudeOnRunner(t, svc, token);
    const localAgent = (
      await http.post('/api/agents', {
        token,
        body: { name: 'local', runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment_id: env.id },
      })
    ).body;
    const sandboxAfterTurn = async (agentId: string) => {
      const conv = await http.post('/api/conversations', { token, body: { agent_id: agentId, prompt: 'hello' } });
      t.equal(conv.status, 201, JSON.stringify(conv.body));
      const done = await eventually(async () => {
        const turns = (await http.get(`/api/conversations/${conv.body.id}/turns`, { token })).body.data;
        return turns[0]?.state === 'done';
      });
      t.ok(done, 'the turn finished');
      return (await http.get(`/api/conversations/${conv.body.id}`, { token })).body.sandbox_id as string;
    };
    const onRunner = await sandboxAfterTurn(runnerAgent.id);
    const local = await sandboxAfterTurn(localAgent.id);
    const runnerDir = join(runner.root, 'sandboxes', onRunner);
    const localRoot = join(svc.dataDir, 'local-sandboxes', victim.accountId);
    const localPid = svc.local.held().find((h) => h.sandboxId === local)?.pid;
    await svc.appendEvents({
      tenant: bystander.accountId,
      producer: 'test',
      seq: 1,
      events: [{ conversationId: null, kind: 'output', stream: 'stdout', data: 'kept' }],
    });

    t.test('the confirmation must be the account email', async (t) => {
      const wrong = await http.delete('/api/account', { token: victim.key, body: { confirm: bystander.email } });
      t.equal(wrong.status, 422);
      t.ok(wrong.body.details.confirm);
      t.equal((await http.get('/api/auth/me', { token: victim.key })).status, 200, 'nothing was deleted');
    });

    t.test('removes every row of the account in every table and its data key', async (t) => {
      t.ok(existsSync(runnerDir) && existsSync(join(localRoot, 'sandboxes', local)), 'both sandboxes are on disk');
      t.ok(alive(localPid), 'the local runner-agent runs');
      t.ok((await svc.eventLog.lastId(victim.accountId)) > 0, 'the live log holds the turns');
      if (backend === 'postgres+redis') t.not((await tenantKeys(svc, victim.accountId)).length, 0);
      const tables = await accounts.tenantTables(svc.db.sql);
      t.ok(tables.length >= 6, `tables with account_id: ${tables.join(', ')}`);
      let before = 0;
      for (const table of tables) before += await accounts.countRowsOfAccount(svc.db.sql, table, victim.accountId);
      t.ok(before > 5, `${before} rows before`);

      const res = await http.delete('/api/account', {
        token: victim.key,
        body: { confirm: victim.email.toUpperCase() },
      });
      t.equal(res.status, 204);
      // By the time the deletion answers, not at the next heartbeat:
      t.notOk(svc.fabric.isLive(runnerRow.id), "the self-hosted runner's connection is closed");
      t.notOk(alive(localPid), 'the local runner-agent has stopped');
      for (const table of tables) {
        t.equal(
          await accounts.countRowsOfAccount(svc.db.sql, table, victim.accountId),
          0,
          `${table} is empty for the account`,
        );
      }
      t.equal(
        await accounts.findAccountById(svc.db.sql, victim.accountId),
        undefined,
        'the account row and its data key are gone',
      );
      t.equal((await http.get('/api/auth/me', { token: victim.key })).status, 401);
      t.equal((await http.get('/api/auth/me', { token: bystander.key })).status, 200, 'other accounts are untouched');
    });

    t.test("stops the account's machines and removes their disk", async (t) => {
      t.ok(await eventually(() => !existsSync(runnerDir)), 'the self-hosted runner destroyed its sandbox directory');
      t.ok(await eventually(() => runner.child.exitCode !== null), 'the runner connection was closed');
      t.equal(runner.child.exitCode, 6, 'and the runner-agent stopped as revoked');
      t.same(svc.local.held(), [], 'this node holds no runner-agent for it');
      t.notOk(existsSync(localRoot), 'the local sandboxes directory of the account is gone');
    });

    t.test("drops the account's live log and nobody else's", async (t) => {
      t.equal(await svc.eventLog.lastId(victim.accountId), 0);
      t.same(await svc.eventLog.read(victim.accountId, { after: 0, limit: 10 }), []);
      t.same(
        (await svc.eventLog.read(bystander.accountId, { after: 0, limit: 10 })).map((e) => e.data),
        ['kept'],
      );
      if (backend === 'postgres+redis') {
        t.same(await tenantKeys(svc, victim.accountId), [], 'no Redis key of the tenant is left');
        t.not((await tenantKeys(svc, bystander.accountId)).length, 0);
      }
    });
  });
}
