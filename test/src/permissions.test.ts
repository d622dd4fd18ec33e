import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { issueSandboxToken } from '../../gateway/src/services/credentials.ts';
import { type Backend, signUp, startTestService, type TestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { frames, parseFrame, rawGet, type WireEvent } from './sse-client.ts';
import { settlesWithin } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));

const OPTIONS = [
  { optionId: 'allow', name: 'Allow once', kind: 'allow_once' },
  { optionId: 'reject', name: 'Reject', kind: 'reject_once' },
];

async function service(t: Test, env: Record<string, string> = {}, backend?: Backend) {
  return startTestService(t, {
    ...(backend ? { backend } : {}),
    env: {
      RUNNER_HEARTBEAT_MS: '500',
      RUNNER_GRACE_MS: '1500',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      SSE_IDLE_CLOSE_MS: '20000',
      ...env,
    },
  });
}

/** A signed-up account with a credential, an environment and a connected svc-runner. */
async function account(t: Test, svc: TestService) {
  const me = await signUp(svc);
  const { http } = svc;
  const token = me.key;
  await http.put('/api/account/inference-credentials/anthropic_api_key', {
    token,
    body: { value: 'sk-ant-test-credential-123456' },
  });
  const env = (await http.post('/api/environments', { token, body: { name: 'main' } })).body;
  const runner = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const root = mkdtempSync(join(tmpdir(), 'svc-perms-root-'));
  const child = spawn(process.execPath, [BIN, '--url', svc.url, '--token', runner.token, '--root', root], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout?.on('data', (d) => {
    out += d;
  });
  child.stderr?.on('data', (d) => {
    out += d;
  });
  t.teardown(() => child.kill('SIGKILL'));
  for (let i = 0; i < 600 && !/connected as runner/.test(out); i++) await sleep(50);
  if (!/connected as runner/.test(out)) throw new Error(`the runner did not connect: ${out}`);
  let agents = 0;
  const agent = async (permission_policy?: { default: 'auto_allow' | 'ask'; ask: string[] }) =>
    (
      await http.post('/api/agents', {
        token,
        body: {
          name: `coder ${++agents}`,
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: env.id,
          sandbox_provider: 'runner',
          ...(permission_policy ? { permission_policy } : {}),
        },
      })
    ).body as { id: string };
  const feed = async (id: string) =>
    (await http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as WireEvent[];
  /** Waits until the conversation's feed satisfies `pred`; returns the feed then. */
  const until = async (id: string, pred: (events: WireEvent[]) => boolean, ms = 20_000) => {
    const deadline = Date.now() + ms;
    for (;;) {
      const events = await feed(id);
      if (pred(events)) return events;
      if (Date.now() > deadline) throw new Error(`timed out; feed: ${JSON.stringify(events.slice(-6))}`);
      await sleep(50);
    }
  };
  const turnState = async (id: string, ms = 20_000) => {
    const deadline = Date.now() + ms;
    for (;;) {
      const turns = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data as { state: string }[];
      if (turns[0]?.state !== 'running' || Date.now() > deadline) return turns[0]?.state;
      await sleep(50);
    }
  };
  const launch = async (agentId: string, prompt: string) => {
    const res = await http.post('/api/conversations', { token, body: { agent_id: agentId, prompt } });
    if (res.status !== 201) throw new Error(`launch answered ${res.status}: ${res.text}`);
    return res.body as { id: string; sandbox_id: string };
  };
  return { ...me, token, runner, child: child as ChildProcess, agent, feed, until, turnState, launch };
}

const permissionBlock = (events: WireEvent[]) =>
  events.flatMap((e) => e.blocks ?? []).find((b) => b.kind === 'permission_request');
const replyText = (events: WireEvent[]) =>
  events
    .flatMap((e) => e.blocks ?? [])
    .filter((b) => b.kind === 'text')
    .map((b) => b.body)
    .join('');
const requestStages = (events: WireEvent[]) =>
  events
    .filter((e) => e.stage === 'request')
    .map((e) => ({ state: e.state, data: JSON.parse(e.data ?? 'null') as Record<string, unknown> }));
async function pendingRows(svc: TestService, conversationId: string) {
  return svc.db.sql<{ id: string; status: string; resolution: string | null; option_id: string | null }[]>`
    SELECT id, status, resolution, option_id FROM permission_requests WHERE conversation_id = ${conversationId}`;
}

t.test('permission requests answered over the API, with a real svc-runner and ACP runtime', async (t) => {
  const svc = await service(t);
  const { http } = svc;
  const a = await account(t, svc);
  const asking = await a.agent({ default: 'auto_allow', ask: ['edit'] });

  t.test('a request the policy asks about waits; the first answer wins and reaches the runtime', async (t) => {
    const conv = await a.launch(asking.id, 'ask permission please');
    const watch = rawGet(svc, `/api/conversations/${conv.id}/stream?blocks=true&last_event_id=0`, {
      authorization: `Bearer ${a.token}`,
    });
    const events = await a.until(conv.id, (es) => permissionBlock(es) !== undefined);
    const block = permissionBlock(events);
    t.match(block?.request_id, /^prq_[0-9a-f]{24}$/, 'the runner named the request');
    t.equal(block?.summary, 'Allow write notes.md?');
    t.same(block?.options, OPTIONS, 'with the options the runtime offered');
    const requestId = block?.request_id as string;
    t.same(
      requestStages(events),
      [{ state: 'started', data: { request_id: requestId, options: OPTIONS } }],
      'stage request started',
    );
    t.same(await pendingRows(svc, conv.id), [{ id: requestId, status: 'pending', resolution: null, option_id: null }]);
    await sleep(300);
    t.equal(
      (await http.get(`/api/conversations/${conv.id}`, { token: a.token })).body.status,
      'running',
      'the turn waits for the answer',
    );
    const path = `/api/conversations/${conv.id}/requests/${requestId}`;

    const sprite = await issueSandboxToken(svc.db.sql, a.accountId, conv.id);
    const bySprite = await http.post(path, { token: sprite.key, body: { option_id: 'allow' } });
    t.equal(bySprite.status, 403);
    t.match(bySprite.body, { error: 'sprite_may_not_answer', message: /sandbox token may not answer/ });

    const other = await signUp(svc);
    const byOther = await http.post(path, { token: other.key, body: { option_id: 'allow' } });
    t.equal(byOther.status, 404, "another tenant's request is not found");
    t.equal(byOther.body.error, 'not_found');
    const unknown = await http.post(`/api/conversations/${conv.id}/requests/prq_000000000000000000000000`, {
      token: a.token,
      body: { option_id: 'allow' },
    });
    t.equal(unknown.status, 404);
    t.match(unknown.body, { error: 'not_found', message: 'Permission request not found.' });

    const bad = await http.post(path, { token: a.token, body: { option_id: 'maybe' } });
    t.equal(bad.status, 422);
    t.match(bad.body, { error: 'unknown_option', message: /allow, reject/, options: ['allow', 'reject'] });
    t.equal((await pendingRows(svc, conv.id))[0]?.status, 'pending', 'an unknown option changes nothing');

    const answered = await http.post(path, { token: a.token, body: { option_id: 'reject' } });
    t.equal(answered.status, 200, JSON.stringify(answered.body));
    t.match(answered.body, {
      id: requestId,
      conversation_id: conv.id,
      turn_id: events.find((e) => e.stage === 'request')?.turn_id,
      status: 'resolved',
      resolution: 'answered',
      option_id: 'reject',
      options: OPTIONS,
    });
    t.ok(answered.body.resolved_at, 'with the time it was resolved');

    const again = await http.post(path, { token: a.token, body: { option_id: 'allow' } });
    t.equal(again.status, 409, 'a second answer is 409');
    t.match(again.body, {
      error: 'permission_request_resolved',
      request: { id: requestId, resolution: 'answered', option_id: 'reject' },
    });

    t.equal(await a.turnState(conv.id), 'done', 'the turn went on and ended done');
    const after = await a.until(conv.id, (es) => /permission: reject/.test(replyText(es)));
    t.match(replyText(after), /permission: reject\./, 'the runtime got the answer');
    t.match(requestStages(after), [
      { state: 'started' },
      { state: 'done', data: { request_id: requestId, resolution: 'answered', option_id: 'reject' } },
    ]);
    t.same(await pendingRows(svc, conv.id), [
      { id: requestId, status: 'resolved', resolution: 'answered', option_id: 'reject' },
    ]);

    t.ok(await settlesWithin(watch.closed, 20_000), 'the stream ended');
    const streamed = frames(watch.text())
      .map(parseFrame)
      .filter((e) => e.data !== undefined)
      .map((e) => JSON.parse(e.data as string) as WireEvent);
    t.match(permissionBlock(streamed), { request_id: requestId, options: OPTIONS }, 'the block came over SSE');

    const audit = await http.get('/api/audit?action_prefix=permission_request.', { token: a.token });
    t.match(audit.body.data, [
      {
        action: 'permission_request.answered',
        actor: 'api',
        resource_type: 'permission_request',
        resource_id: requestId,
        metadata: { conversation_id: conv.id, option_id: 'reject' },
      },
    ]);
    t.equal(audit.body.data.length, 1, 'only the answer that won is audited');
  });

  t.test('a request the policy does not ask about is allowed at once, logged, and not recorded', async (t) => {
    const plain = await a.agent();
    const conv = await a.launch(plain.id, 'use permission');
    t.equal(await a.turnState(conv.id), 'done');
    const events = await a.until(conv.id, (es) => /permission: allow/.test(replyText(es)));
    const block = permissionBlock(events);
    t.same(block?.options, OPTIONS, 'the request is in the log');
    t.same(requestStages(events), [
      { state: 'done', data: { request_id: block?.request_id, resolution: 'policy', option_id: 'allow' } },
    ]);
    t.same(await pendingRows(svc, conv.id), [], 'nothing waits for an answer');
    const late = await http.post(`/api/conversations/${conv.id}/requests/${block?.request_id}`, {
      token: a.token,
      body: { option_id: 'reject' },
    });
    t.equal(late.status, 404, 'there is nothing to answer');
  });

  t.test('default ask makes every request wait; an interrupt resolves it and the turn ends', async (t) => {
    const strict = await a.agent({ default: 'ask', ask: [] });
    const conv = await a.launch(strict.id, 'permission');
    const events = await a.until(conv.id, (es) => permissionBlock(es) !== undefined);
    const requestId = permissionBlock(events)?.request_id as string;
    const turnId = events.find((e) => e.stage === 'request')?.turn_id as string;
    // What POST /api/conversations/:id/interrupt sends the runner.
    await svc.fabric.command(a.runner.id, {
      kind: 'turn.interrupt',
      sandbox: conv.sandbox_id,
      conversation_id: conv.id,
      turn_id: turnId,
    });
    t.equal(await a.turnState(conv.id), 'interrupted');
    const after = await a.until(conv.id, (es) => requestStages(es).length === 2);
    t.match(requestStages(after)[1], {
      state: 'done',
      data: { request_id: requestId, resolution: 'interrupted', option_id: null },
    });
    t.same(await pendingRows(svc, conv.id), [
      { id: requestId, status: 'resolved', resolution: 'interrupted', option_id: null },
    ]);
    const late = await http.post(`/api/conversations/${conv.id}/requests/${requestId}`, {
      token: a.token,
      body: { option_id: 'allow' },
    });
    t.equal(late.status, 409);
    t.match(late.body, { error: 'permission_request_resolved', request: { resolution: 'interrupted' } });
  });

  t.test('a runner gone mid-request: 503 runner_offline, then the turn ends and the request with it', async (t) => {
    const b = await account(t, svc);
    const strict = await b.agent({ default: 'ask', ask: [] });
    const conv = await b.launch(strict.id, 'permission');
    const events = await b.until(conv.id, (es) => permissionBlock(es) !== undefined);
    const requestId = permissionBlock(events)?.request_id as string;
    b.child.kill('SIGKILL');
    await sleep(300);
    const path = `/api/conversations/${conv.id}/requests/${requestId}`;
    const offline = await http.post(path, { token: b.token, body: { option_id: 'allow' } });
    t.equal(offline.status, 503);
    t.equal(offline.body.error, 'runner_offline');
    t.equal((await pendingRows(svc, conv.id))[0]?.status, 'pending', 'an answer the runner never took is undone');
    t.equal(await b.turnState(conv.id), 'failed', 'the turn failed after the grace');
    t.same(await pendingRows(svc, conv.id), [
      { id: requestId, status: 'resolved', resolution: 'turn_end', option_id: null },
    ]);
    const after = await b.until(conv.id, (es) => requestStages(es).length === 2);
    t.same(requestStages(after)[1], {
      state: 'done',
      data: { request_id: requestId, resolution: 'turn_end', option_id: null },
    });
    const late = await http.post(path, { token: b.token, body: { option_id: 'allow' } });
    t.equal(late.status, 409);
    t.equal(late.body.error, 'permission_request_resolved');
  });
});

// On the embedded PostgreSQL (18) as well as the run's server (Debian's 15): the request's SQL runs on both.
t.test('an unanswered request is denied after PERMISSION_TIMEOUT_S and the turn goes on (embedded)', async (t) => {
  const svc = await service(t, { PERMISSION_TIMEOUT_S: '1' }, 'embedded');
  const a = await account(t, svc);
  const asking = await a.agent({ default: 'auto_allow', ask: ['edit'] });
  const conv = await a.launch(asking.id, 'permission');
  const events = await a.until(conv.id, (es) => permissionBlock(es) !== undefined);
  const requestId = permissionBlock(events)?.request_id as string;
  t.equal(await a.turnState(conv.id), 'done', 'the turn went on');
  const after = await a.until(conv.id, (es) => /permission: /.test(replyText(es)));
  t.match(replyText(after), /permission: reject\./, 'the runtime got the reject option');
  const done = after.find((e) => e.stage === 'request' && e.state === 'done');
  t.same(JSON.parse(done?.data ?? 'null'), { request_id: requestId, resolution: 'timeout', option_id: 'reject' });
  t.ok((done?.duration_ms ?? 0) >= 1000, 'after the timeout');
  t.same(await pendingRows(svc, conv.id), [
    { id: requestId, status: 'resolved', resolution: 'timeout', option_id: 'reject' },
  ]);
  const late = await svc.http.post(`/api/conversations/${conv.id}/requests/${requestId}`, {
    token: a.token,
    body: { option_id: 'allow' },
  });
  t.equal(late.status, 409);
  t.match(late.body, { error: 'permission_request_resolved', request: { resolution: 'timeout' } });
});
