/**
 * Scopes that leaked (DECISIONS "Sandboxes that hold", scope): registering a runner needs a
 * full-scope key, a standard key cannot revoke a full-scope one, a sandbox token's
 * sub-conversation runs with its parent's vault or none, and support reports keep no webhook
 * signing secret.
 */
import t from 'tap';
import { startFakeProvider } from './fakes/inference-provider.ts';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { ranIn, replyOf, run64, turnSettled } from './scripted-turns.ts';

t.test('scopes', async (t) => {
  const model = await startFakeProvider();
  t.teardown(() => model.close());
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, ANTHROPIC_BASE_URL: model.url },
  });
  const { http } = svc;
  const me = await signUp(svc);
  const full = me.key;
  const standard = (await http.post('/api/auth/api-keys', { token: full, body: { name: 'ci', scope: 'standard' } }))
    .body;
  t.equal(standard.scope, 'standard');

  t.test('registering a runner needs a full-scope key', async (t) => {
    const refused = await http.post('/api/runners', { token: standard.key, body: { name: 'box' } });
    t.equal(refused.status, 403);
    t.match(refused.body, { error: 'forbidden', message: /full-scope/ });
    t.same((await http.get('/api/runners', { token: full })).body.data, [], 'no runner was made');
    const made = await http.post('/api/runners', { token: full, body: { name: 'box' } });
    t.equal(made.status, 201);
    t.match(made.body.token, /^svcr_/);
  });

  t.test('a standard key cannot revoke a full-scope key; a full-scope key can', async (t) => {
    const other = (await http.post('/api/auth/api-keys', { token: full, body: { name: 'admin', scope: 'full' } })).body;
    const refused = await http.delete(`/api/auth/api-keys/${other.id}`, { token: standard.key });
    t.equal(refused.status, 403);
    t.match(refused.body, { error: 'forbidden', message: /full-scope/ });
    t.equal((await http.get('/api/auth/me', { token: other.key })).status, 200, 'the full-scope key still works');
    const peer = (await http.post('/api/auth/api-keys', { token: full, body: { name: 'peer', scope: 'standard' } }))
      .body;
    t.equal((await http.delete(`/api/auth/api-keys/${peer.id}`, { token: standard.key })).status, 204);
    t.equal((await http.delete(`/api/auth/api-keys/${other.id}`, { token: full })).status, 204);
    t.equal((await http.get('/api/auth/me', { token: other.key })).status, 401, 'revoked');
    t.equal((await http.delete(`/api/auth/api-keys/key_nope`, { token: standard.key })).status, 404);
  });

  t.test('a sandbox token’s sub-conversation runs with its parent’s vault or none', async (t) => {
    await http.put('/api/account/inference-credentials/anthropic_api_key', {
      token: full,
      body: { value: 'sk-ant-test-credential-123456' },
    });
    const env = (await http.post('/api/environments', { token: full, body: { name: 'scopes' } })).body;
    const agent = (
      await http.post('/api/agents', {
        token: full,
        body: { name: 'scoped', runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment_id: env.id },
      })
    ).body;
    const vault = async (name: string, value: string) => {
      const v = (await http.post('/api/vaults', { token: full, body: { name } })).body;
      await http.post(`/api/vaults/${v.id}/secrets`, { token: full, body: { key: 'DEPLOY_KEY', value } });
      return v.id as string;
    };
    const own = await vault('own', 'own-deploy-key-123456');
    const other = await vault('other', 'other-deploy-key-654321');
    // The agent's Bash tool calls the API with the runtime's own sandbox token.
    const post = (body: Record<string, unknown>) =>
      `curl -s -X POST "$SVC_API_URL/api/conversations" -H "authorization: Bearer $SVC_SANDBOX_TOKEN" -H "x-svc-parent-conversation-id: $SVC_CONVERSATION_ID" -H 'content-type: application/json' -d '${JSON.stringify(body)}'`;
    const lines = [
      post({ agent_id: agent.id, vault_id: other, prompt: 'print env DEPLOY_KEY' }),
      post({ agent_id: agent.id, prompt: 'print env DEPLOY_KEY' }),
    ];
    const res = await http.post('/api/conversations', {
      token: full,
      body: {
        agent_id: agent.id,
        vault_id: own,
        prompt: run64(lines),
      },
    });
    t.equal(res.status, 201, JSON.stringify(res.body));
    await turnSettled(http, full, res.body.id);
    const { reply } = await replyOf(http, full, res.body.id);
    const said = ranIn(reply).map((r) => JSON.parse(r.out));
    t.match(said[0], { error: 'forbidden', message: /parent’s vault/ }, `another vault is refused: ${reply}`);
    t.match(said[1], { id: /^cnv_/ }, 'without one, the child is made');
    const child = (await http.get(`/api/conversations/${said[1]?.id}`, { token: full })).body;
    const sandbox = (await http.get(`/api/sandboxes/${child.sandbox_id}`, { token: full })).body;
    t.equal(sandbox.vault_id, own, 'and runs with its parent’s vault');
    const all = (await http.get('/api/sandboxes?limit=50', { token: full })).body.data as { vault_id: string | null }[];
    t.notOk(
      all.some((s) => s.vault_id === other),
      'no sandbox holds the other vault',
    );
  });

  t.test('support reports keep no webhook signing secret', async (t) => {
    const hook = (
      await http.post('/api/webhooks', {
        token: full,
        body: { url: 'https://hooks.example.com/in' },
      })
    ).body;
    t.match(hook.secret, /^whsec_/);
    const stripe = 'whsec_4eC39HqLyjWDarjtT1zdp7dc1234';
    const report = await http.post('/api/support/reports', {
      token: full,
      body: {
        category: 'bug',
        message: `my hook ${hook.secret} and stripe ${stripe} fail`,
        context: { note: hook.secret },
      },
    });
    t.equal(report.status, 201, JSON.stringify(report.body));
    const stored = (await http.get(`/api/support/reports/${report.body.id}`, { token: full })).body;
    t.notMatch(JSON.stringify(stored), 'whsec_', 'neither our signing secret nor a payment provider’s is kept');
    t.match(stored.message, 'my hook [REDACTED] and stripe [REDACTED] fail');
  });
});
