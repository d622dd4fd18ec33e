import { credentials } from '@svc/db';
import t from 'tap';
import { hashSecret, newSecret } from '../../gateway/src/secrets/tokens.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import type { WireEvent } from './sse-client.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

for (const backend of backends()) {
  t.test(`sandboxes shared: attach, persistent machines, sub-conversations (${backend})`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: {
        RUNNER_HEARTBEAT_MS: '500',
        RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
        RUNTIME_OPENCODE_COMMAND: SCRIPTED_AGENT_COMMAND,
      },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const other = await signUp(svc);
    const token = me.key;
    // The build takes a moment, so a second persistent launch meets it provisioning.
    const env = (await http.post('/api/environments', { token, body: { name: 'main', setup_script: 'sleep 1' } })).body;
    const env2 = (await http.post('/api/environments', { token, body: { name: 'second' } })).body;
    const newAgent = async (name: string, runtime: string, extra: Record<string, unknown> = {}) =>
      (
        await http.post('/api/agents', {
          token,
          body: {
            name,
            runtime,
            model: 'anthropic/claude-sonnet-4-5',
            environment_id: env.id,
            sandbox_provider: 'runner',
            allowed_environment_ids: [env.id, env2.id],
            ...extra,
          },
        })
      ).body;
    const agent = await newAgent('coder', 'claude');
    const helper = await newAgent('helper', 'claude');
    const single = await newAgent('single', 'opencode');
    await http.put('/api/account/inference-credentials/anthropic_api_key', {
      token,
      body: { value: 'sk-ant-test-credential-123456' },
    });
    const runnerRow = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
    await startRunnerProcess(t, svc.url, runnerRow.token);

    const launch = (body: Record<string, unknown>, headers: Record<string, string> = {}, as = token) =>
      http.post('/api/conversations', { token: as, body, headers });
    const sandboxOf = async (id: string) =>
      (
        await svc.db.sql<{ status: string; incarnation: number }[]>`
      SELECT status, incarnation FROM sandboxes WHERE id = ${id}`
      )[0];
    const ready = async (sandboxId: string) => {
      for (let i = 0; i < 300; i++) {
        if ((await sandboxOf(sandboxId))?.status === 'ready') return;
        await sleep(50);
      }
      throw new Error(`sandbox ${sandboxId} never became ready: ${JSON.stringify(await sandboxOf(sandboxId))}`);
    };
    const idle = async (id: string) => {
      for (let i = 0; i < 300; i++) {
        if ((await http.get(`/api/conversations/${id}`, { token })).body.status !== 'running') return;
        await sleep(50);
      }
      throw new Error(`conversation ${id} still running`);
    };
    const feed = async (id: string) =>
      (await http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as WireEvent[];
    const stagesOf = async (id: string) =>
      (await feed(id)).filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
    const text = async (id: string) =>
      (await feed(id))
        .flatMap((e) => e.blocks ?? [])
        .filter((b) => b.kind === 'text')
        .map((b) => b.body)
        .join('');

    t.test('persistent: one machine per agent, environment and vault; 503 provisioning while it builds', async (t) => {
      const first = await launch({ agent_id: agent.id, prompt: 'hello', sandbox_mode: 'persistent' });
      t.equal(first.status, 201, JSON.stringify(first.body));
      const building = await launch({ agent_id: agent.id, prompt: 'me too', sandbox_mode: 'persistent' });
      t.equal(building.status, 503);
      t.equal(building.body.error, 'provisioning');
      t.ok(building.headers.get('retry-after'), 'with Retry-After');
      await ready(first.body.sandbox_id);
      await idle(first.body.id);
      const second = await launch({ agent_id: agent.id, prompt: 'second visit', sandbox_mode: 'persistent' });
      t.equal(second.status, 201, JSON.stringify(second.body));
      t.equal(second.body.sandbox_id, first.body.sandbox_id, 'the same machine');
      await idle(second.body.id);
      t.same(
        await stagesOf(second.body.id),
        ['turn started', 'session started', 'session done', 'turn done'],
        'nothing built',
      );
      t.match(await text(second.body.id), /You said: second visit/);
      const otherEnv = await launch({
        agent_id: agent.id,
        prompt: 'elsewhere',
        sandbox_mode: 'persistent',
        environment_id: env2.id,
      });
      t.equal(otherEnv.status, 201);
      t.not(otherEnv.body.sandbox_id, first.body.sandbox_id, 'another environment is another machine');
      await idle(otherEnv.body.id);
      const ephemeral = await launch({ agent_id: agent.id, prompt: 'throwaway' });
      t.not(ephemeral.body.sandbox_id, first.body.sandbox_id, 'an ephemeral launch gets its own');
      await idle(ephemeral.body.id);
    });

    t.test('launch refusals: environments and vaults outside the allowlists, unknown ids', async (t) => {
      const before = (await http.get('/api/conversations', { token })).body.data.length;
      const outside = (await http.post('/api/environments', { token, body: { name: 'outside' } })).body;
      const envRefused = await launch({ agent_id: agent.id, environment_id: outside.id });
      t.match(envRefused, {
        status: 422,
        body: { error: 'validation_failed', details: { environment_id: [/allowed_environment_ids/] } },
      });
      t.match(await launch({ agent_id: agent.id, environment_id: 'env_unknown' }), {
        status: 404,
        body: { error: 'not_found' },
      });
      const vault = (await http.post('/api/vaults', { token, body: { name: 'v' } })).body;
      const closed = await newAgent('closed', 'claude', { allowed_vault_ids: [] });
      t.match(await launch({ agent_id: closed.id, vault_id: vault.id }), {
        status: 422,
        body: { error: 'validation_failed', details: { vault_id: [/allowed_vault_ids/] } },
      });
      t.match(await launch({ agent_id: agent.id, vault_id: 'vlt_unknown' }), { status: 404 });
      t.match(await launch({ agent_id: agent.id, images: [{ data: 'iVBORw0KGgo=', media_type: 'image/png' }] }), {
        status: 422,
        body: { error: 'validation_failed', details: { images: [/prompt/] } },
      });
      t.match(await launch({ agent_id: 'agt_unknown' }), { status: 404 });
      t.equal((await http.get('/api/conversations', { token })).body.data.length, before, 'refusals created nothing');
    });

    t.test('attach by sandbox_id, and every refusal', async (t) => {
      const host = await launch({ agent_id: agent.id, prompt: 'host' });
      t.equal(host.status, 201);
      await ready(host.body.sandbox_id);
      await idle(host.body.id);
      const guest = await launch({ agent_id: agent.id, prompt: 'guest', sandbox_id: host.body.sandbox_id });
      t.equal(guest.status, 201, JSON.stringify(guest.body));
      t.equal(guest.body.sandbox_id, host.body.sandbox_id);
      await idle(guest.body.id);
      t.match(await text(guest.body.id), /You said: guest/);
      t.notOk((await stagesOf(guest.body.id)).includes('provision started'), 'nothing provisioned');

      const before = (await http.get('/api/conversations', { token })).body.data.length;
      const unknown = await launch({ agent_id: agent.id, sandbox_id: 'sbx_nope' });
      t.match(unknown, { status: 404, body: { error: 'sandbox_not_found' } });
      const stranger = await launch({ agent_id: agent.id, sandbox_id: host.body.sandbox_id }, {}, other.key);
      t.equal(stranger.status, 404, 'another tenant: the agent is not theirs either');
      const mismatch = await launch({ agent_id: helper.id, sandbox_id: host.body.sandbox_id });
      t.match(mismatch, { status: 422, body: { error: 'sandbox_identity_mismatch' } });
      const wrongEnv = await launch({ agent_id: agent.id, sandbox_id: host.body.sandbox_id, environment_id: env2.id });
      t.match(wrongEnv, { status: 422, body: { error: 'sandbox_identity_mismatch' } });
      t.equal((await http.post(`/api/conversations/${host.body.id}/terminate`, { token })).status, 200);
      t.equal((await sandboxOf(host.body.sandbox_id))?.status, 'ready', 'shared with a live guest: the sandbox stays');
      t.equal((await http.post(`/api/conversations/${guest.body.id}/terminate`, { token })).status, 200);
      t.equal((await sandboxOf(host.body.sandbox_id))?.status, 'terminated', 'the last one out destroys it');
      const gone = await launch({ agent_id: agent.id, sandbox_id: host.body.sandbox_id });
      t.match(gone, { status: 409, body: { error: 'sandbox_not_attachable' } });
      t.equal((await http.get('/api/conversations', { token })).body.data.length, before, 'refusals created nothing');
    });

    t.test('an opencode sandbox runs one turn at a time: 409 sandbox_at_capacity', async (t) => {
      const host = await launch({ agent_id: single.id, prompt: 'warm up' });
      await ready(host.body.sandbox_id);
      await idle(host.body.id);
      const slow = await http.post(`/api/conversations/${host.body.id}/prompts`, {
        token,
        body: { prompt: 'be slow' },
      });
      t.equal(slow.status, 201);
      const before = (await http.get('/api/conversations', { token })).body.data.length;
      const second = await launch({ agent_id: single.id, prompt: 'me too', sandbox_id: host.body.sandbox_id });
      t.match(second, { status: 409, body: { error: 'sandbox_at_capacity' } });
      t.equal((await http.get('/api/conversations', { token })).body.data.length, before, 'nothing created');
      const quiet = await launch({ agent_id: single.id, sandbox_id: host.body.sandbox_id });
      t.equal(quiet.status, 201, 'attaching without a prompt is fine');
      const busy = await http.post(`/api/conversations/${quiet.body.id}/prompts`, { token, body: { prompt: 'now?' } });
      t.match(busy, { status: 409, body: { error: 'sandbox_at_capacity' } });
      await idle(host.body.id);
      const later = await http.post(`/api/conversations/${quiet.body.id}/prompts`, { token, body: { prompt: 'now' } });
      t.equal(later.status, 201, 'once the first turn ended');
      await idle(quiet.body.id);
    });

    t.test('a runtime starts a sub-conversation with its sandbox token', async (t) => {
      const parent = await launch({ agent_id: agent.id, prompt: `spawn ${helper.id}` });
      t.equal(parent.status, 201);
      await idle(parent.body.id);
      const said = await text(parent.body.id);
      const child = /spawned 201 (cnv_\w+)/.exec(said)?.[1];
      t.ok(child, `the runtime says it spawned one: ${said}`);
      const tree = (await http.get(`/api/conversations/${parent.body.id}/tree`, { token })).body.data;
      t.match(tree, [
        { id: parent.body.id, parent_id: null, source: 'ui' },
        { id: child, parent_id: parent.body.id, source: 'agent' },
      ]);
      const roots = (await http.get('/api/conversations?roots_only=true', { token })).body.data as { id: string }[];
      t.notOk(
        roots.some((c) => c.id === child),
        'not a root',
      );

      // A sandbox token of the parent, minted the way the launch does, to try what it may not.
      const key = newSecret('svcs_');
      await credentials.insertCredential(svc.db.sql, {
        id: 'spt_test',
        accountId: me.accountId,
        kind: 'sandbox',
        name: 'test',
        prefix: key.slice(0, 12),
        tokenHash: hashSecret(key),
        scope: 'conversation',
        conversationId: parent.body.id,
      });
      const noHeader = await launch({ agent_id: helper.id }, {}, key);
      t.match(noHeader, { status: 403, body: { error: 'forbidden' } });
      const elsewhere = await launch({ agent_id: helper.id }, { 'x-svc-parent-conversation-id': child as string }, key);
      t.match(elsewhere, { status: 403, body: { error: 'forbidden' } });
      const otherTenant = await launch(
        { agent_id: agent.id },
        { 'x-svc-parent-conversation-id': parent.body.id },
        other.key,
      );
      t.equal(otherTenant.status, 404, 'another tenant cannot hang a conversation under ours');
      const list = await http.get('/api/agents', { token: key });
      t.equal(list.status, 403, 'and the token reaches nothing else');
      t.equal((await http.post(`/api/conversations/${parent.body.id}/terminate`, { token })).status, 200);
      const revoked = await launch({ agent_id: helper.id }, { 'x-svc-parent-conversation-id': parent.body.id }, key);
      t.equal(revoked.status, 401, 'the conversation ended: its tokens are revoked');
    });
  });
}
