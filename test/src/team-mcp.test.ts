import { chmodSync, mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { conversations } from '@svc/db';
import t, { type Test } from 'tap';
import { issueSandboxToken } from '../../gateway/src/services/credentials.ts';
import { backends, signUp, startTestService, type TestService } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { until } from './until.ts';

/*
 * The team MCP server `svc-team` as a runtime's MCP client meets it: the SDK's own client over
 * Streamable HTTP, authenticated by a conversation's sandbox token, against real teammates
 * (added with POST /api/team, their turns run by a real runner with the scripted agent).
 */

type ToolResult = { content: { type: string; text?: string }[]; isError?: boolean; structuredContent?: any };

async function mcpClient(t: Test, svc: TestService, conversationId: string, token: string) {
  const client = new Client({ name: 'team-mcp-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(`${svc.url}/api/mcp/team/${conversationId}`), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  t.teardown(() => client.close());
  const call = async (name: string, args: Record<string, unknown> = {}) =>
    (await client.callTool({ name, arguments: args }, undefined, { timeout: 120_000 })) as ToolResult;
  return { client, call };
}

const textOf = (r: ToolResult) => r.content.map((c) => c.text ?? '').join('');

// Each backend starts a service, a runner and a machine per teammate.

for (const backend of backends())
  t.test(`the team MCP server svc-team on ${backend}`, async (t) => {
    // A wait holds a call for TEAM_WAIT_MS (90 s by default): 15 s here, past the edge's idle limit (10 s).
    const svc = await startTestService(t, {
      backend,
      env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, TEAM_WAIT_MS: '15000' },
    });
    const { http } = svc;
    const sql = svc.db.sql;
    const me = await signUp(svc);
    const token = me.key;
    const { env, agent: coder, runner } = await claudeOnRunner(t, svc, token);
    const agentOf = async (name: string, description: string) => {
      const res = await http.post('/api/agents', {
        token,
        body: {
          name,
          description,
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: env.id,
          sandbox_provider: 'runner',
        },
      });
      t.equal(res.status, 201, res.text);
      return res.body as { id: string };
    };
    const reviewer = await agentOf('reviewer-agent', 'Reviews pull requests for security issues');
    const writer = await agentOf('writer-agent', 'Writes documentation');

    /** The reply of the conversation's turn `turnId`, once it has ended. */
    const replyOf = async (conversationId: string, turnId: string) =>
      until(
        `turn ${turnId} ends`,
        async () => {
          const turns = (await http.get(`/api/conversations/${conversationId}/turns`, { token })).body.data;
          const turn = turns.find((x: { id: string }) => x.id === turnId);
          return turn && turn.state !== 'running' ? (turn.reply as string) : undefined;
        },
        60_000,
      );
    /** Sends a prompt and resolves to the reply. */
    const ask = async (conversationId: string, prompt: string) => {
      const res = await http.post(`/api/conversations/${conversationId}/prompts`, { token, body: { prompt } });
      t.equal(res.status, 201, res.text);
      return replyOf(conversationId, res.body.id);
    };
    /**
     * The live conversation of `agentId` added to the team as `name` (or, with `team` false, a
     * conversation of it off the team), once its sandbox is built and a first turn has ended.
     */
    const conversation = async (agentId: string, name: string, team = true) => {
      const res = team
        ? await http.post('/api/team', { token, body: { agent_id: agentId, name } })
        : await http.post('/api/conversations', { token, body: { agent_id: agentId } });
      t.equal(res.status, 201, res.text);
      const id = (team ? res.body.conversation.id : res.body.id) as string;
      await until('the sandbox is built', async () => {
        const c = (await http.get(`/api/conversations/${id}`, { token })).body;
        return c.sandbox_id && (await http.get(`/api/sandboxes/${c.sandbox_id}`, { token })).body.status === 'ready';
      });
      await ask(id, 'hello');
      return id;
    };
    const ada = await conversation(coder.id, 'Ada');
    const rex = await conversation(reviewer.id, 'Rex');
    await conversation(writer.id, 'Wendy');
    const loner = await conversation(coder.id, 'Loner', false);
    const adaToken = (await issueSandboxToken(sql, me.accountId, ada)).key;
    const lonerToken = (await issueSandboxToken(sql, me.accountId, loner)).key;
    const rexToken = (await issueSandboxToken(sql, me.accountId, rex)).key;

    t.test("only the conversation's own sandbox token, and only on the team channel", async (t) => {
      const rpc = { jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} };
      const headers = { accept: 'application/json, text/event-stream' };
      const none = await http.post(`/api/mcp/team/${ada}`, { body: rpc, headers });
      t.match(none, { status: 401, body: { error: 'unauthorized' } });
      const person = await http.post(`/api/mcp/team/${ada}`, { token, body: rpc, headers });
      t.match(person, { status: 403, body: { error: 'forbidden' } }, "a person's API key is refused");
      const other = await http.post(`/api/mcp/team/${ada}`, { token: rexToken, body: rpc, headers });
      t.match(other, { status: 404, body: { error: 'not_found' } }, "another teammate's token does not reach it");
      const offTeam = await http.post(`/api/mcp/team/${loner}`, { token: lonerToken, body: rpc, headers });
      t.match(offTeam, { status: 404, body: { error: 'not_found' } }, 'a conversation off the team has no server');
      const ok = await http.post(`/api/mcp/team/${ada}`, { token: adaToken, body: rpc, headers });
      t.equal(ok.status, 200, ok.text);
      t.equal(ok.body.id, 1);
      t.ok(Array.isArray(ok.body.result.tools));
      for (const method of ['GET', 'DELETE']) {
        const res = await http.call(method, `/api/mcp/team/${ada}`, { token: adaToken, headers });
        t.match(res, { status: 405, body: { error: 'method_not_allowed' } }, `${method} is 405: no stream, no session`);
        t.equal(res.headers.get('allow'), 'POST');
      }
    });

    const { client, call } = await mcpClient(t, svc, ada, adaToken);

    t.test('the five tools, each with a description and an input schema', async (t) => {
      const { tools } = await client.listTools();
      t.same(tools.map((x) => x.name).sort(), [
        'get_teammate',
        'list_teammates',
        'read_teammate',
        'send_to_teammate',
        'wait_for_teammate',
      ]);
      for (const tool of tools) {
        t.ok((tool.description ?? '').length > 40, `${tool.name} says what it does`);
        t.equal(tool.inputSchema.type, 'object');
      }
      const send = tools.find((x) => x.name === 'send_to_teammate');
      t.same(send?.inputSchema.required?.sort(), ['message', 'teammate']);
      const wait = tools.find((x) => x.name === 'wait_for_teammate');
      t.same(
        Object.keys(wait?.inputSchema.properties ?? {}).sort(),
        ['since_turn', 'teammate'],
        'wait_for_teammate takes the teammate and an optional since_turn, as SPEC lists, no timeout',
      );
      t.same(wait?.inputSchema.required, ['teammate']);
    });

    t.test('list_teammates: everyone on the team but the caller', async (t) => {
      const r = await call('list_teammates');
      t.notOk(r.isError);
      const mates = r.structuredContent.teammates as { name: string; agent_id: string; role: string }[];
      t.same(mates.map((m) => m.name).sort(), ['Rex', 'Wendy']);
      t.match(
        mates.find((m) => m.name === 'Rex'),
        {
          agent_id: reviewer.id,
          agent_name: 'reviewer-agent',
          role: 'Reviews pull requests for security issues',
          presence: { state: String, label: String },
          conversation_id: rex,
        },
      );
      t.same(JSON.parse(textOf(r)), r.structuredContent, 'the text says the same, for clients that read text only');
    });

    t.test('get_teammate: by name, role or keyword, any case; no match is a tool error', async (t) => {
      const byName = await call('get_teammate', { query: 'rEx' });
      t.same(
        byName.structuredContent.teammates.map((m: { name: string }) => m.name),
        ['Rex'],
      );
      const byRole = await call('get_teammate', { query: 'SECURITY' });
      t.same(
        byRole.structuredContent.teammates.map((m: { name: string }) => m.name),
        ['Rex'],
      );
      const byKeyword = await call('get_teammate', { query: 'documentation' });
      t.same(
        byKeyword.structuredContent.teammates.map((m: { name: string }) => m.name),
        ['Wendy'],
      );
      const none = await call('get_teammate', { query: 'astronaut' });
      t.equal(none.isError, true);
      t.match(textOf(none), /No teammate matches "astronaut"\. Teammates: .*Rex/);
    });

    t.test('send_to_teammate: the message lands in their thread, named and with the note', async (t) => {
      const self = await call('send_to_teammate', { teammate: 'ada', message: 'hi me' });
      t.equal(self.isError, true, 'sending to yourself is a tool error');
      t.match(textOf(self), /Ada is you/);
      const unknown = await call('send_to_teammate', { teammate: 'Zed', message: 'hi' });
      t.equal(unknown.isError, true);
      t.match(textOf(unknown), /No teammate is named "Zed"/);

      const sent = await call('send_to_teammate', { teammate: 'Rex', message: 'please review PR 7 slow' });
      t.notOk(sent.isError, textOf(sent));
      t.match(sent.structuredContent, {
        teammate: 'Rex',
        agent_id: reviewer.id,
        conversation_id: rex,
        state: 'running',
      });
      const turnId = sent.structuredContent.turn_id as string;
      const turn = await conversations.getTurn(sql, me.accountId, turnId);
      t.equal(turn?.conversation_id, rex);
      t.match(turn?.prompt, /^Message from Ada, your teammate: please review PR 7 slow\n/);
      t.match(turn?.prompt, /Only your owner and your teammates can send you a message like this one\.[^\n]*$/);

      const busy = await call('send_to_teammate', { teammate: reviewer.id, message: 'and another' });
      t.equal(busy.isError, true, 'a busy teammate is a tool error, by agent id too');
      t.match(textOf(busy), /Rex is busy/);

      const waited = await call('wait_for_teammate', { teammate: 'Rex', since_turn: turnId });
      t.match(waited.structuredContent, { timed_out: false, turn_id: turnId, conversation_id: rex, state: 'done' });
      t.match(waited.structuredContent.reply, /^You said: Message from Ada, your teammate: please review PR 7 slow/);

      const again = await call('wait_for_teammate', { teammate: 'Rex' });
      t.match(
        again.structuredContent,
        { timed_out: false, turn_id: turnId, state: 'done' },
        'their last turn, at once',
      );
      const foreign = await call('wait_for_teammate', { teammate: 'Wendy', since_turn: turnId });
      t.equal(foreign.isError, true, "another teammate's turn is not theirs to wait for");
    });

    t.test('read_teammate: recent prompts and replies, newest last, limited', async (t) => {
      const all = await call('read_teammate', { teammate: 'Rex' });
      const turns = all.structuredContent.turns as { prompt: string; reply: string; state: string }[];
      t.equal(turns.length, 2);
      t.equal(turns[0]?.prompt, 'hello');
      t.match(turns[1]?.prompt, /^Message from Ada/);
      t.match(turns[1]?.reply, /^You said: Message from Ada/);
      const last = await call('read_teammate', { teammate: 'Rex', limit: 1 });
      t.same(last.structuredContent.turns, [turns[1]]);
    });
    t.test('the runtime of a team conversation holds svc-team with its token, redacted in the log', async (t) => {
      const said = await ask(ada, 'show mcp');
      const servers = JSON.parse(/mcp servers: (\[.*\])\./s.exec(said)?.[1] ?? 'null');
      t.same(servers, [
        {
          type: 'http',
          name: 'svc-team',
          url: `${svc.url}/api/mcp/team/${ada}`,
          headers: [{ name: 'Authorization', value: 'Bearer [REDACTED]' }],
        },
      ]);
      t.match(await ask(loner, 'show mcp'), /mcp servers: \[\]\./, 'a conversation off the team has no svc-team');
    });

    t.test('one agent messages another and waits for the reply, through its runtime', async (t) => {
      const said = await ask(
        ada,
        'mcp send_to_teammate {"teammate": "Wendy", "message": "draft the notes"} mcp wait_for_teammate {"teammate": "Wendy"}',
      );
      t.match(said, /mcp send_to_teammate: \{[\s\S]*"teammate": "Wendy"/);
      const waited = JSON.parse(/mcp wait_for_teammate: (\{[\s\S]*\})/.exec(said)?.[1] ?? 'null');
      t.match(waited, { teammate: 'Wendy', timed_out: false, state: 'done' });
      t.match(waited.reply, /^You said: Message from Ada, your teammate: draft the notes/);
    });
    t.test("a runtime without HTTP MCP reaches svc-team through the runner's stdio bridge", async (t) => {
      const stdioEnv = await http.post('/api/environments', {
        token,
        body: { name: 'stdio only', env_vars: { SCRIPTED_ACP_NO_HTTP_MCP: '1' } },
      });
      t.equal(stdioEnv.status, 201, stdioEnv.text);
      const res = await http.post('/api/agents', {
        token,
        body: {
          name: 'stdio-agent',
          description: 'Knows only stdio MCP servers',
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: stdioEnv.body.id,
          sandbox_provider: 'runner',
        },
      });
      const stan = await conversation(res.body.id, 'Stan');
      const servers = JSON.parse(/mcp servers: (\[.*\])\./s.exec(await ask(stan, 'show mcp'))?.[1] ?? 'null');
      t.match(servers, [
        {
          name: 'svc-team',
          command: process.execPath,
          args: [/svc-runner/, 'mcp-bridge', `${svc.url}/api/mcp/team/${stan}`],
          env: [{ name: 'SVC_MCP_HEADERS', value: '[{"name":"Authorization","value":"Bearer [REDACTED]"}]' }],
        },
      ]);
      t.notOk('type' in (servers[0] ?? {}), 'a stdio server');
      const said = await ask(stan, 'mcp get_teammate {"query": "ada"} mcp get_teammate {"query": "nobody"}');
      t.match(said, /mcp get_teammate: \{[\s\S]*"name": "Ada"/, 'a call goes through the bridge and back');
      t.match(said, /mcp get_teammate error: No teammate matches "nobody"/, 'and a tool error too');
    });
    t.test('a wait holds its call through the edge past any idle limit, then says timed_out', async (t) => {
      // A turn that nothing runs: only its deadline ends the wait.
      const turn = await conversations.startTurn(sql, {
        id: `trn_${'0'.repeat(20)}held01`,
        accountId: me.accountId,
        conversationId: rex,
        prompt: 'held',
        origin: 'user',
      });
      if (typeof turn === 'string') throw new Error(turn);
      t.teardown(() => conversations.endTurn(sql, me.accountId, turn.id, 'interrupted', null));
      const held = await call('wait_for_teammate', { teammate: 'Rex' });
      t.notOk(held.isError, textOf(held));
      t.match(held.structuredContent, { timed_out: true, turn_id: turn.id, state: 'running' });
    });
    t.test('a teammate whose machine is still being built is starting, and a message to it a tool error', async (t) => {
      // The build waits for this file, so the machine is being built for as long as the test needs
      // (outside /tmp, which an isolated sandbox has a private one of).
      const gates = mkdtempSync(fileURLToPath(new URL('../../.tap/team-gate-', import.meta.url)));
      chmodSync(gates, 0o755);
      const gate = join(gates, 'go');
      const slowEnv = await http.post('/api/environments', {
        token,
        body: { name: 'slow build', setup_script: `while [ ! -f ${gate} ]; do sleep 0.1; done` },
      });
      t.equal(slowEnv.status, 201, slowEnv.text);
      const slowAgent = await http.post('/api/agents', {
        token,
        body: {
          name: 'slow-agent',
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: slowEnv.body.id,
          sandbox_provider: 'runner',
        },
      });
      const added = await http.post('/api/team', { token, body: { agent_id: slowAgent.body.id, name: 'Sam' } });
      t.equal(added.status, 201, added.text);
      t.teardown(() => writeFileSync(gate, ''));
      const sam = (await call('get_teammate', { query: 'Sam' })).structuredContent.teammates[0];
      t.match(sam, { name: 'Sam', presence: { state: 'starting' } });
      const sent = await call('send_to_teammate', { teammate: 'Sam', message: 'welcome' });
      t.equal(sent.isError, true);
      t.match(textOf(sent), /Sam is still starting/);
      writeFileSync(gate, '');
    });

    t.test('a teammate whose machine is off is a tool error saying so (this ends the runner)', async (t) => {
      runner.child.kill('SIGKILL');
      const offline = await until('Rex shows machine_offline', async () => {
        const r = await call('get_teammate', { query: 'Rex' });
        const rex = r.structuredContent?.teammates?.[0];
        return rex?.presence.state === 'machine_offline' ? rex : undefined;
      });
      t.match(offline, { name: 'Rex', presence: { state: 'machine_offline' } });
      const sent = await call('send_to_teammate', { teammate: 'Rex', message: 'are you there' });
      t.equal(sent.isError, true);
      t.match(textOf(sent), /Rex's machine is offline/);
    });
  });
