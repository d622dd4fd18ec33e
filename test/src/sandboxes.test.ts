import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { conversations, type Sql } from '@svc/db';
import t, { type Test } from 'tap';
import { type Backend, backends, signUp, startTestService, type TestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { eventually } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = (check: () => boolean | Promise<boolean>, ms = 20_000) => eventually(check, ms, 50);

/** A promise and the function that resolves it. */
function latch(): [Promise<void>, () => void] {
  let open!: () => void;
  const p = new Promise<void>((r) => {
    open = r;
  });
  return [p, open];
}
const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));

const ENV = {
  RUNNER_HEARTBEAT_MS: '500',
  RUNNER_GRACE_MS: '5000',
  RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
};

interface Tenant {
  key: string;
  accountId: string;
  runnerId: string;
  root: string;
  envId: string;
  agentId: string;
}

/**
 * An account ready to launch on its own real svc-runner: a credential, an environment (with
 * `setup`), an agent on provider `runner` (persistent by `mode` unless a launch says otherwise).
 */
async function tenant(
  t: Test,
  svc: TestService,
  setup = 'echo built',
  mode: 'ephemeral' | 'persistent' = 'persistent',
): Promise<Tenant> {
  const me = await signUp(svc);
  const { http } = svc;
  const token = me.key;
  const put = await http.put('/api/account/inference-credentials/anthropic_api_key', {
    token,
    body: { value: 'sk-ant-test-credential-123456' },
  });
  t.equal(put.status, 200);
  const env = (await http.post('/api/environments', { token, body: { name: 'main', setup_script: setup } })).body;
  const agent = (
    await http.post('/api/agents', {
      token,
      body: {
        name: 'coder',
        runtime: 'claude',
        model: 'anthropic/claude-sonnet-4-5',
        environment_id: env.id,
        sandbox_provider: 'runner',
        sandbox_mode: mode,
      },
    })
  ).body;
  t.ok(agent.id, JSON.stringify(agent));
  const runner = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const root = mkdtempSync(join(tmpdir(), 'svc-sandboxes-root-'));
  const child: ChildProcess = spawn(
    process.execPath,
    [BIN, '--url', svc.url, '--token', runner.token, '--root', root],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  child.stdout?.on('data', (d) => {
    out += d;
  });
  t.teardown(() => {
    child.kill('SIGTERM');
  });
  t.ok(await until(() => /connected as runner/.test(out), 30_000), `the runner connected: ${out}`);
  return { key: token, accountId: me.accountId, runnerId: runner.id, root, envId: env.id, agentId: agent.id };
}

for (const backend of backends()) {
  t.test(`sandboxes: status, listing, reset and retirement on a real svc-runner (${backend})`, (t) =>
    lifecycle(t, backend),
  );
  t.test(`quota and fleet ceiling at launch (${backend})`, (t) => capacity(t, backend));
}

async function lifecycle(t: Test, backend: Backend) {
  const svc = await startTestService(t, { backend, env: ENV });
  const { http } = svc;
  const a = await tenant(t, svc, 'sleep 1; echo built');
  const launch = (body: Record<string, unknown>, who: Tenant = a) =>
    http.post('/api/conversations', { token: who.key, body: { agent_id: who.agentId, ...body } });
  const get = (id: string, who: Tenant = a) => http.get(`/api/sandboxes/${id}`, { token: who.key });
  const statusOf = async (id: string) => (await get(id)).body.status as string;
  const row = async (id: string) =>
    (
      await svc.db.sql<{ incarnation: number; built_incarnation: number | null; status: string }[]>`
        SELECT incarnation, built_incarnation, status FROM sandboxes WHERE id = ${id}`
    )[0];
  const turnOver = async (conversationId: string) =>
    until(
      async () => (await http.get(`/api/conversations/${conversationId}`, { token: a.key })).body.status === 'idle',
      30_000,
    );

  let ready = ''; // a persistent sandbox, ready, no turn
  let readyConversation = '';

  await t.test('a sandbox is provisioning until its runner reports the build done, then ready', async (t) => {
    const res = await launch({});
    t.equal(res.status, 201, JSON.stringify(res.body));
    ready = res.body.sandbox_id;
    readyConversation = res.body.id;
    const early = await get(ready);
    t.equal(early.status, 200);
    t.equal(early.body.status, 'provisioning', 'the setup script is still sleeping');
    t.ok(await until(async () => (await statusOf(ready)) === 'ready'), 'ready once the build is done');
    const body = (await get(ready)).body;
    t.same(body, {
      id: ready,
      status: 'ready',
      mode: 'persistent',
      provider: 'runner',
      url: null,
      agent_id: a.agentId,
      environment_id: a.envId,
      vault_id: null,
      conversations: [{ id: readyConversation, mid_turn: false }],
      runner: { id: a.runnerId, name: 'box', hostname: body.runner?.hostname, online: true, path: a.root },
      created_at: body.created_at,
    });
    t.type(body.runner.hostname, 'string');
    t.match(body.created_at, /^\d{4}-\d\d-\d\dT.*Z$/);
    t.ok(existsSync(join(a.root, 'sandboxes', ready)), 'its machine is on the runner');
    t.same(await row(ready), { incarnation: 0, built_incarnation: 0, status: 'ready' });
  });

  let failed = '';
  await t.test('a build that fails makes the sandbox failed', async (t) => {
    const broken = (
      await http.post('/api/environments', { token: a.key, body: { name: 'broken', setup_script: 'exit 3' } })
    ).body;
    await http.call('PATCH', `/api/agents/${a.agentId}`, {
      token: a.key,
      body: { allowed_environment_ids: [a.envId, broken.id] },
    });
    const res = await launch({ environment_id: broken.id });
    t.equal(res.status, 201, JSON.stringify(res.body));
    failed = res.body.sandbox_id;
    t.ok(await until(async () => (await statusOf(failed)) === 'failed'), 'failed after the setup script failed');
    const events = (await http.get(`/api/conversations/${res.body.id}/events?limit=1000`, { token: a.key })).body
      .data as {
      stage: string | null;
      state: string | null;
      data: string | null;
    }[];
    const end = events.find((e) => e.stage === 'sandbox' && e.state === 'failed');
    t.match(end?.data, /exited with 3/, 'the log says why');
  });

  let ephemeral = '';
  await t.test('list and filter by status; an unknown status is 400 invalid_status', async (t) => {
    const res = await launch({ sandbox_mode: 'ephemeral' });
    t.equal(res.status, 201);
    ephemeral = res.body.sandbox_id;
    t.ok(await until(async () => (await statusOf(ephemeral)) === 'ready'));
    const all = (await http.get('/api/sandboxes', { token: a.key })).body.data as { id: string; mode: string }[];
    t.same(
      all.map((s) => s.id),
      [ephemeral, failed, ready],
      'newest first',
    );
    t.equal(all[0]?.mode, 'ephemeral');
    const readyOnes = (await http.get('/api/sandboxes?status=ready', { token: a.key })).body.data;
    t.same(
      readyOnes.map((s: { id: string }) => s.id),
      [ephemeral, ready],
    );
    const some = (await http.get('/api/sandboxes?status=failed,suspended', { token: a.key })).body.data;
    t.same(
      some.map((s: { id: string; status: string }) => [s.id, s.status]),
      [[failed, 'failed']],
    );
    t.same((await http.get('/api/sandboxes?status=terminated', { token: a.key })).body.data, []);
    const bad = await http.get('/api/sandboxes?status=ready,asleep', { token: a.key });
    t.equal(bad.status, 400);
    t.equal(bad.body.error, 'invalid_status');
    t.match(bad.body.message, /ready, suspended, terminated, failed/);
  });

  await t.test("another tenant's sandbox is 404, and its list is its own", async (t) => {
    const other = await signUp(svc);
    const res = await http.get(`/api/sandboxes/${ready}`, { token: other.key });
    t.equal(res.status, 404);
    t.equal(res.body.error, 'sandbox_not_found');
    const del = await http.delete(`/api/sandboxes/${ready}`, { token: other.key });
    t.equal(del.status, 404);
    t.equal(del.body.error, 'sandbox_not_found');
    t.same((await http.get('/api/sandboxes', { token: other.key })).body.data, []);
    t.equal(await statusOf(ready), 'ready', 'untouched');
    const missing = await get('sbx_nothing_here');
    t.equal(missing.status, 404);
  });

  await t.test('mid_turn is true while a conversation runs a turn; a reset then is 409 sandbox_mid_turn', async (t) => {
    // Another identity (a vault) gets its own persistent machine.
    const vault = (await http.post('/api/vaults', { token: a.key, body: { name: 'mid' } })).body;
    const res = await launch({ prompt: 'be slow', vault_id: vault.id });
    t.equal(res.status, 201, JSON.stringify(res.body));
    const sandbox = res.body.sandbox_id as string;
    t.not(sandbox, ready);
    const body = (await get(sandbox)).body;
    t.same(body.conversations, [{ id: res.body.id, mid_turn: true }], 'mid-turn from the launch on');
    t.ok(await until(async () => (await statusOf(sandbox)) === 'ready'), 'built while the turn runs');
    const del = await http.delete(`/api/sandboxes/${sandbox}`, { token: a.key });
    t.equal(del.status, 409);
    t.equal(del.body.error, 'sandbox_mid_turn');
    t.same(del.body.conversations, [res.body.id], 'naming the conversation mid-turn');
    t.same(await row(sandbox), { incarnation: 0, built_incarnation: 0, status: 'ready' }, 'nothing changed');
    t.ok(existsSync(join(a.root, 'sandboxes', sandbox)), 'the machine is still there');
    t.ok(await turnOver(res.body.id), 'the turn ended');
    t.same((await get(sandbox)).body.conversations, [{ id: res.body.id, mid_turn: false }]);
    const turns = (await http.get(`/api/conversations/${res.body.id}/turns`, { token: a.key })).body.data;
    t.equal(turns[0]?.state, 'done', 'the turn was not disturbed by the refused reset');
  });

  await t.test('DELETE resets a persistent ready sandbox: 204, machine destroyed, conversations kept', async (t) => {
    t.ok(existsSync(join(a.root, 'sandboxes', ready)));
    const del = await http.delete(`/api/sandboxes/${ready}`, { token: a.key });
    t.equal(del.status, 204, JSON.stringify(del.body));
    t.ok(await until(() => !existsSync(join(a.root, 'sandboxes', ready))), "the runner's sandbox directory is gone");
    t.same(
      await row(ready),
      { incarnation: 1, built_incarnation: 0, status: 'ready' },
      'a new incarnation without a machine: the next prompt builds it',
    );
    const body = (await get(ready)).body;
    t.equal(body.status, 'ready');
    t.same(body.conversations, [{ id: readyConversation, mid_turn: false }], 'conversations kept');
    t.equal((await http.get(`/api/conversations/${readyConversation}`, { token: a.key })).status, 200);
    const audit = await svc.db.sql<{ action: string; actor: string; metadata: { incarnation: number } }[]>`
      SELECT action, actor, metadata FROM audit_events WHERE resource_id = ${ready}`;
    t.match(audit, [{ action: 'sandbox.reset', actor: 'api', metadata: { incarnation: 1 } }], 'audited');
  });
  // Two connections race: one holds a turn's transaction open while the reset runs.
  await t.test('a turn starting while a reset runs: the reset waits for it, then answers 409', async (t) => {
    const [gate, release] = latch();
    const [started, begun] = latch();
    const turnId = `trn_race${Date.now()}`;
    const turn = svc.db.sql.begin(async (tx) => {
      await conversations.startTurn(tx as unknown as Sql, {
        id: turnId,
        accountId: a.accountId,
        conversationId: readyConversation,
        prompt: 'racing the reset',
        origin: 'user',
      });
      begun();
      await gate;
    });
    await started;
    let answered = false;
    const reset = http.delete(`/api/sandboxes/${ready}`, { token: a.key }).then((r) => {
      answered = true;
      return r;
    });
    await sleep(500);
    t.notOk(answered, 'the reset waits on the conversation the turn is starting on');
    release();
    await turn;
    const res = await reset;
    t.equal(res.status, 409, JSON.stringify(res.body));
    t.equal(res.body.error, 'sandbox_mid_turn');
    t.equal((await row(ready))?.incarnation, 1, 'not reset under the turn');
    await conversations.endTurn(svc.db.sql, a.accountId, turnId, 'done', null);
    const again = await http.delete(`/api/sandboxes/${ready}`, { token: a.key });
    t.equal(again.status, 204, 'once the turn ended the reset goes through');
    t.equal((await row(ready))?.incarnation, 2);
  });

  await t.test('a prompt whose machine another request starts building meanwhile is 503 provisioning', async (t) => {
    // The reset left the sandbox ready without a machine, so the prompt builds one; another
    // request (here, this transaction) starts that build first and holds the row meanwhile.
    const [gate, release] = latch();
    const [started, begun] = latch();
    const rival = svc.db.sql.begin(async (tx) => {
      await tx`UPDATE sandboxes SET status = 'provisioning', incarnation = incarnation + 1 WHERE id = ${ready}`;
      begun();
      await gate;
    });
    await started;
    const before = (await http.get(`/api/conversations/${readyConversation}`, { token: a.key })).body;
    const prompt = http.post(`/api/conversations/${readyConversation}/prompts`, {
      token: a.key,
      body: { prompt: 'build it' },
    });
    const waiting = async () =>
      (
        await svc.db.sql<{ n: number }[]>`
            SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE wait_event_type = 'Lock' AND datname = current_database()`
      )[0]?.n === 1;
    t.ok(await until(waiting), 'the prompt waits on the sandbox the rival is building');
    release();
    await rival;
    const res = await prompt;
    t.equal(res.status, 503, JSON.stringify(res.body));
    t.equal(res.body.error, 'provisioning', 'the same answer a launch gets while the machine is being built');
    const after = (await http.get(`/api/conversations/${readyConversation}`, { token: a.key })).body;
    t.equal(after.turn_count, before.turn_count, 'no turn was recorded');
    t.equal(after.status, 'idle');
    await svc.db.sql`UPDATE sandboxes SET status = 'ready', incarnation = incarnation - 1 WHERE id = ${ready}`;
  });

  await t.test('422 sandbox_not_resettable for ephemeral, failed and terminated sandboxes', async (t) => {
    for (const [id, why] of [
      [ephemeral, /persistent/],
      [failed, /failed/],
    ] as const) {
      const del = await http.delete(`/api/sandboxes/${id}`, { token: a.key });
      t.equal(del.status, 422);
      t.equal(del.body.error, 'sandbox_not_resettable');
      t.match(del.body.message, why);
    }
    t.equal(await statusOf(ephemeral), 'ready', 'the ephemeral one is untouched');
    // No route terminates a sandbox yet: the state is set directly.
    const gone = await launch({});
    t.ok(await until(async () => (await statusOf(gone.body.sandbox_id)) === 'ready'));
    await svc.db.sql`UPDATE sandboxes SET status = 'terminated' WHERE id = ${gone.body.sandbox_id}`;
    const del = await http.delete(`/api/sandboxes/${gone.body.sandbox_id}`, { token: a.key });
    t.equal(del.status, 422);
    t.equal(del.body.error, 'sandbox_not_resettable');
    t.match(del.body.message, /terminated/);
    t.same(
      (await http.get('/api/sandboxes?status=terminated', { token: a.key })).body.data.map((s: { id: string }) => s.id),
      [gone.body.sandbox_id],
    );
  });

  await t.test(
    'retirement: an agent moved to another environment retires its idle persistent sandboxes, not one mid-turn',
    async (t) => {
      const b = await tenant(t, svc, 'echo built');
      const idle = await launch({}, b);
      // Another identity (a vault), so not the idle one's machine.
      const other = (await http.post('/api/vaults', { token: b.key, body: { name: 'other' } })).body;
      const busy = await launch({ prompt: 'be slow', vault_id: other.id }, b);
      const eph = await launch({ sandbox_mode: 'ephemeral' }, b);
      for (const r of [idle, busy, eph]) {
        t.equal(r.status, 201);
        t.ok(await until(async () => (await get(r.body.sandbox_id, b)).body.status === 'ready'));
      }
      t.equal((await get(busy.body.sandbox_id, b)).body.conversations[0].mid_turn, true);
      const next = (await http.post('/api/environments', { token: b.key, body: { name: 'next' } })).body;
      const patched = await http.call('PATCH', `/api/agents/${b.agentId}`, {
        token: b.key,
        body: { environment_id: next.id },
      });
      t.equal(patched.status, 200, JSON.stringify(patched.body));
      t.ok(await until(() => !existsSync(join(b.root, 'sandboxes', idle.body.sandbox_id))), 'the idle machine is gone');
      const inc = async (id: string) =>
        (await svc.db.sql<{ incarnation: number }[]>`SELECT incarnation FROM sandboxes WHERE id = ${id}`)[0]
          ?.incarnation;
      t.equal(await inc(idle.body.sandbox_id), 1, 'the idle persistent sandbox was retired');
      t.equal(await inc(busy.body.sandbox_id), 0, 'the one mid-turn was left');
      t.ok(existsSync(join(b.root, 'sandboxes', busy.body.sandbox_id)), 'its machine serves the turn');
      t.equal(await inc(eph.body.sandbox_id), 0, 'ephemeral sandboxes are not retired');
      const audit = await svc.db.sql<{ actor: string; metadata: { reason: string } }[]>`
      SELECT actor, metadata FROM audit_events WHERE action = 'sandbox.retired' AND resource_id = ${idle.body.sandbox_id}`;
      t.match(audit, [{ actor: 'system', metadata: { reason: 'agent_environment_changed' } }]);

      await t.test('deleting the environment retires what was built on it (the turn has ended now)', async (t) => {
        const conv = busy.body.id as string;
        t.ok(
          await until(
            async () => (await http.get(`/api/conversations/${conv}`, { token: b.key })).body.status === 'idle',
            30_000,
          ),
        );
        const del = await http.delete(`/api/environments/${b.envId}`, { token: b.key });
        t.equal(del.status, 204, JSON.stringify(del.body));
        t.equal(await inc(busy.body.sandbox_id), 1, 'retired once no turn ran');
        t.ok(await until(() => !existsSync(join(b.root, 'sandboxes', busy.body.sandbox_id))), 'its machine is gone');
        t.equal(await inc(eph.body.sandbox_id), 0);
      });

      await t.test('deleting a vault retires the persistent sandboxes built with it', async (t) => {
        const vault = (await http.post('/api/vaults', { token: b.key, body: { name: 'keys' } })).body;
        t.ok(vault.id, JSON.stringify(vault));
        const withVault = await launch({ vault_id: vault.id }, b);
        const without = await launch({}, b);
        for (const r of [withVault, without]) {
          t.equal(r.status, 201, JSON.stringify(r.body));
          t.ok(await until(async () => (await get(r.body.sandbox_id, b)).body.status === 'ready'));
        }
        t.equal((await get(withVault.body.sandbox_id, b)).body.vault_id, vault.id);
        const del = await http.delete(`/api/vaults/${vault.id}`, { token: b.key });
        t.equal(del.status, 204, JSON.stringify(del.body));
        t.equal(await inc(withVault.body.sandbox_id), 1, 'the one built with the vault was retired');
        t.equal(await inc(without.body.sandbox_id), 0, 'the other was not');
        t.ok(
          await until(() => !existsSync(join(b.root, 'sandboxes', withVault.body.sandbox_id))),
          'its machine is gone',
        );
        t.ok(existsSync(join(b.root, 'sandboxes', without.body.sandbox_id)));
      });
    },
  );
}

async function capacity(t: Test, backend: Backend) {
  const svc = await startTestService(t, {
    backend,
    env: { ...ENV, SANDBOX_QUOTA_DEFAULT: '2', FLEET_MAX_SANDBOXES: '3' },
  });
  const { http } = svc;
  // Ephemeral: each launch makes a sandbox (persistent launches of one identity share one).
  const a = await tenant(t, svc, 'echo built', 'ephemeral');
  const launch = (who: Tenant) => http.post('/api/conversations', { token: who.key, body: { agent_id: who.agentId } });

  await t.test('launches racing past the quota: two pass, the third is 429 with active and limit', async (t) => {
    const results = await Promise.all([launch(a), launch(a), launch(a)]);
    const codes = results.map((r) => r.status).sort();
    t.same(codes, [201, 201, 429]);
    const refused = results.find((r) => r.status === 429);
    t.same(refused?.body, {
      error: 'sandbox_quota_exceeded',
      message: refused?.body.message,
      active: 2,
      limit: 2,
    });
    t.match(refused?.headers.get('retry-after'), /^\d+$/, 'with Retry-After');
    t.equal(
      (await http.get('/api/conversations', { token: a.key })).body.data.length,
      2,
      'no conversation left behind',
    );
    t.equal((await http.get('/api/sandboxes', { token: a.key })).body.data.length, 2, 'no sandbox left behind');
  });

  await t.test('a failed sandbox no longer counts', async (t) => {
    const [one] = (await http.get('/api/sandboxes', { token: a.key })).body.data;
    await svc.db.sql`UPDATE sandboxes SET status = 'failed' WHERE id = ${one.id}`;
    const res = await launch(a);
    t.equal(res.status, 201, JSON.stringify(res.body));
    const again = await launch(a);
    t.equal(again.status, 429);
    t.match(again.body, { active: 2, limit: 2 });
  });

  await t.test('the fleet ceiling counts every account: 503 fleet_full with Retry-After', async (t) => {
    const b = await tenant(t, svc, 'echo built', 'ephemeral');
    const first = await launch(b);
    t.equal(first.status, 201, 'the third active sandbox of the instance');
    const res = await launch(b);
    t.equal(res.status, 503);
    t.equal(res.body.error, 'fleet_full');
    t.match(res.headers.get('retry-after'), /^\d+$/);
    t.equal((await http.get('/api/conversations', { token: b.key })).body.data.length, 1, 'nothing created');
  });
}
