import t from 'tap';
import { messageTeammate } from '../../gateway/src/services/team.ts';
import { backends } from './harness.ts';
import { teamSetUp } from './team-setup.ts';
import { until } from './until.ts';

// Each backend starts a service and builds a machine per teammate.

for (const backend of backends()) {
  t.test(`the team on ${backend}`, async (t) => {
    const { svc, http, token, accountId, other, agentOf, turnsOf, settled, online, teamStream } = await teamSetUp(
      t,
      backend,
    );

    t.test('adding an agent opens its live conversation on the team channel: 201, then 200 as it is', async (t) => {
      const agent = await agentOf(token, 'ada');
      const stream = teamStream(t);
      await stream.connected();
      const res = await http.post('/api/team', { token, body: { agent_id: agent.id, name: '  Ada Lovelace ' } });
      t.equal(res.status, 201, res.text);
      t.equal(res.body.agent_id, agent.id);
      t.equal(res.body.name, 'Ada Lovelace');
      t.equal(res.body.agent.id, agent.id);
      t.equal(res.body.agent.name, 'ada');
      t.match(res.body.conversation, { title: 'Ada Lovelace', channel_id: 'svc:team', agent_id: agent.id });
      t.equal(res.body.conversation.turn_count, 0, 'no prompt is sent');
      t.equal(res.body.last_turn, null);
      t.equal(res.body.preview, null);
      t.same(res.body.usage_total, { input: 0, output: 0 });
      const sandbox = (await http.get(`/api/sandboxes/${res.body.conversation.sandbox_id}`, { token })).body;
      t.equal(sandbox.mode, 'persistent', "the agent's lasting machine");

      const event = await until('the team event', () => stream.events().find((e) => e.event === 'team'));
      t.same(JSON.parse(event.data as string), { reason: 'changed' });

      const again = await http.post('/api/team', { token, body: { agent_id: agent.id, name: 'Someone else' } });
      t.equal(again.status, 200);
      t.equal(again.body.conversation.id, res.body.conversation.id, 'its live conversation');
      t.equal(again.body.name, 'Ada Lovelace', 'attributes ignored');

      const read = await http.get(`/api/team/${agent.id}`, { token });
      t.equal(read.status, 200);
      t.equal(read.body.conversation.id, res.body.conversation.id);
      const roster = (await http.get('/api/team', { token })).body.data as { agent_id: string }[];
      t.same(
        roster.map((m) => m.agent_id),
        [agent.id],
      );
      const audit = (await http.get('/api/audit?action_prefix=team.added', { token })).body.data;
      t.equal(audit.length, 1, 'audited once');
      t.match(audit[0], { action: 'team.added', resource_type: 'agent', resource_id: agent.id });
      const listed = (await http.get('/api/conversations?channel_id=svc:team', { token })).body.data;
      t.same(
        listed.map((c: { id: string }) => c.id),
        [res.body.conversation.id],
      );
    });

    t.test("without a name the conversation takes the agent's name", async (t) => {
      const agent = await agentOf(token, 'grace');
      const res = await http.post('/api/team', { token, body: { agent_id: agent.id, name: '   ' } });
      t.equal(res.status, 201);
      t.equal(res.body.name, 'grace');
      t.equal(res.body.conversation.title, 'grace');
    });

    t.test('a message runs as a turn whose events reach /api/team/stream with conversation and agent', async (t) => {
      const agent = await agentOf(token, 'linus');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      const stream = teamStream(t);
      await stream.connected();
      const res = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'hello team' } });
      t.equal(res.status, 202, res.text);
      t.same(res.body, { status: 'queued', conversation_id: added.conversation.id });
      const turn = await settled(added.conversation.id, 1);
      t.equal(turn.state, 'done');
      t.equal(turn.prompt, 'hello team');
      const done = await until('the turn end on the team stream', () =>
        stream
          .events()
          .filter((e) => e.data && e.event !== 'team' && e.event !== 'schedule')
          .map((e) => JSON.parse(e.data as string))
          .find((d) => d.stage === 'turn' && d.state === 'done'),
      );
      t.equal(done.conversation_id, added.conversation.id);
      t.equal(done.agent_id, agent.id);
      t.equal(done.turn_id, turn.id);
      const output = stream
        .events()
        .filter((e) => e.data && !e.event)
        .map((e) => JSON.parse(e.data as string))
        .filter((d) => d.kind === 'output');
      t.ok(output.length > 0, 'output events too');
      t.ok(
        output.every((d) => d.conversation_id === added.conversation.id && d.agent_id === agent.id),
        'each names the conversation and the agent',
      );
    });

    t.test('a message while a turn runs is 400 conversation_busy', async (t) => {
      const agent = await agentOf(token, 'slowpoke');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      const first = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'slow please' } });
      t.equal(first.status, 202);
      const busy = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'again' } });
      t.equal(busy.status, 400);
      t.equal(busy.body.error, 'conversation_busy');
      await settled(added.conversation.id, 1);
      t.equal((await turnsOf(added.conversation.id)).length, 1, 'nothing recorded for the refused one');
    });

    t.test('a message to a terminated conversation opens a fresh one, named in the reply', async (t) => {
      const agent = await agentOf(token, 'hopper');
      const vault = (await http.post('/api/vaults', { token, body: { name: 'hopper-keys' } })).body;
      const added = (
        await http.post('/api/team', { token, body: { agent_id: agent.id, name: 'Grace H', vault_id: vault.id } })
      ).body;
      t.equal(
        (await http.get(`/api/sandboxes/${added.conversation.sandbox_id}`, { token })).body.vault_id,
        vault.id,
        'its machine is built with the vault',
      );
      const old = added.conversation.id as string;
      await online(agent.id);
      t.equal((await http.post(`/api/conversations/${old}/terminate`, { token })).status, 200);
      const stream = teamStream(t);
      await stream.connected();
      const res = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'are you there' } });
      t.equal(res.status, 202, res.text);
      t.not(res.body.conversation_id, old, 'a fresh conversation');
      const fresh = (await http.get(`/api/conversations/${res.body.conversation_id}`, { token })).body;
      t.match(fresh, { title: 'Grace H', channel_id: 'svc:team', agent_id: agent.id });
      t.equal(
        fresh.sandbox_id,
        added.conversation.sandbox_id,
        'on the same lasting machine: same environment and vault',
      );
      t.equal((await settled(fresh.id, 1)).prompt, 'are you there', 'the message is its first prompt');
      const mate = (await http.get(`/api/team/${agent.id}`, { token })).body;
      t.equal(mate.conversation.id, fresh.id, 'the teammate points at it');
      t.ok(
        await until('a team event', () => stream.events().some((e) => e.event === 'team')),
        'told the roster changed',
      );
    });

    t.test('a message a sandbox token sends (as the team tools do) opens a fresh conversation too', async (t) => {
      const agent = await agentOf(token, 'shannon');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      t.equal((await http.post(`/api/conversations/${added.conversation.id}/terminate`, { token })).status, 200);
      const fromTeammate = { accountId, actor: 'sprite' as const, ip: null };
      const sent = await messageTeammate({ launch: svc.launch }, fromTeammate, agent.id, { prompt: 'from a peer' });
      t.not(sent.conversationId, added.conversation.id, 'a fresh conversation');
      t.equal(sent.turn.prompt, 'from a peer');
      t.equal(sent.turn.conversation_id, sent.conversationId, 'the turn it opened');
      const fresh = (await http.get(`/api/conversations/${sent.conversationId}`, { token })).body;
      t.match(fresh, { channel_id: 'svc:team', parent_id: null, title: 'shannon' });
      t.equal((await settled(sent.conversationId, 1)).state, 'done');
      t.equal((await http.get(`/api/team/${agent.id}`, { token })).body.conversation.id, sent.conversationId);
    });

    t.test('another tenant’s agent, unknown ids and bad input', async (t) => {
      const theirEnv = (await http.post('/api/environments', { token: other.key, body: { name: 'theirs' } })).body;
      const theirAgent = (
        await http.post('/api/agents', {
          token: other.key,
          body: { name: 'x', runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment_id: theirEnv.id },
        })
      ).body;
      const add = await http.post('/api/team', { token, body: { agent_id: theirAgent.id } });
      t.equal(add.status, 404);
      t.equal(add.body.error, 'not_found');
      t.equal((await http.post('/api/team', { token: other.key, body: { agent_id: theirAgent.id } })).status, 201);
      t.equal((await http.get(`/api/team/${theirAgent.id}`, { token })).status, 404, 'not on my team');
      const msg = await http.post(`/api/team/${theirAgent.id}/messages`, { token, body: { prompt: 'hi' } });
      t.equal(msg.status, 404);
      t.equal(msg.body.error, 'not_found');
      const roster = (await http.get('/api/team', { token })).body.data as { agent_id: string }[];
      t.notOk(
        roster.some((m) => m.agent_id === theirAgent.id),
        'their teammate is not on my roster',
      );

      const notOnTeam = await agentOf(token, 'bench');
      const off = await http.post(`/api/team/${notOnTeam.id}/messages`, { token, body: { prompt: 'hi' } });
      t.equal(off.status, 404);
      t.match(off.body.message, /not on the team/);

      const unknownEnv = await http.post('/api/team', {
        token,
        body: { agent_id: notOnTeam.id, environment_id: theirEnv.id },
      });
      t.equal(unknownEnv.status, 404, "another tenant's environment");
      const vault = (await http.post('/api/vaults', { token, body: { name: 'v' } })).body;
      const strict = await agentOf(token, 'strict', { allowed_vault_ids: [] });
      const refused = await http.post('/api/team', { token, body: { agent_id: strict.id, vault_id: vault.id } });
      t.equal(refused.status, 422);
      t.ok(refused.body.details.vault_id, 'names the vault');
      t.equal((await http.get(`/api/team/${strict.id}`, { token })).status, 404, 'nothing was added');

      // Rule 1: the environment against allowed_environment_ids; unknown or another tenant's ids are 404.
      const elsewhere = (await http.post('/api/environments', { token, body: { name: 'elsewhere' } })).body;
      const homebound = await agentOf(token, 'homebound', { allowed_environment_ids: [] });
      const outside = await http.post('/api/team', {
        token,
        body: { agent_id: homebound.id, environment_id: elsewhere.id },
      });
      t.equal(outside.status, 422, 'an environment outside allowed_environment_ids');
      t.equal(outside.body.error, 'validation_failed');
      t.match(outside.body.details.environment_id, [/allowed_environment_ids/]);
      const unknownEnvId = await http.post('/api/team', {
        token,
        body: { agent_id: homebound.id, environment_id: 'env_doesnotexist' },
      });
      t.equal(unknownEnvId.status, 404, 'an unknown environment');
      t.equal(unknownEnvId.body.error, 'not_found');
      const unknownVault = await http.post('/api/team', {
        token,
        body: { agent_id: homebound.id, vault_id: 'vlt_doesnotexist' },
      });
      t.equal(unknownVault.status, 404, 'an unknown vault');
      t.equal(unknownVault.body.error, 'not_found');
      t.match(unknownVault.body.message, /Vault/);
      const theirVault = (await http.post('/api/vaults', { token: other.key, body: { name: 'their-keys' } })).body;
      const foreignVault = await http.post('/api/team', {
        token,
        body: { agent_id: homebound.id, vault_id: theirVault.id },
      });
      t.equal(foreignVault.status, 404, "another tenant's vault");
      t.equal(foreignVault.body.error, 'not_found');
      t.same(foreignVault.body, unknownVault.body, 'answered exactly as an unknown one');
      t.equal((await http.get(`/api/team/${homebound.id}`, { token })).status, 404, 'none of them added it');

      const missing = await http.post('/api/team', { token, body: { name: 'no agent' } });
      t.equal(missing.status, 422);
      t.ok(missing.body.details.agent_id);
      const extra = await http.post('/api/team', { token, body: { agent_id: strict.id, color: 'red' } });
      t.equal(extra.status, 422);
      const notJson = await http.post('/api/team', {
        token,
        rawBody: '{"agent_id": ',
        headers: { 'content-type': 'application/json' },
      });
      t.equal(notJson.status, 400);
      t.equal(notJson.body.error, 'invalid_request');
      const empty = await http.post(`/api/team/${notOnTeam.id}/messages`, { token, body: { prompt: '' } });
      t.equal(empty.status, 422);
      t.ok(empty.body.details.prompt);
    });
  });
}
