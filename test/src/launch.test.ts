import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { backends, signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { frames, parseFrame, rawGet, type WireEvent } from './sse-client.ts';
import { settlesWithin } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));
// The runtime starts in the sandbox's directory: tsx is named by its absolute location.

for (const backend of backends()) {
  t.test(`a conversation launched over HTTP runs on a real svc-runner, watched over SSE (${backend})`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: {
        RUNNER_HEARTBEAT_MS: '500',
        // Short, so a killed runner's turn fails within the test. A local runner-agent slow to
        // connect is not hurried by it: its start has its own timeout (turns-adrift.test.ts).
        RUNNER_GRACE_MS: '1500',
        RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
        SSE_IDLE_CLOSE_MS: '20000',
      },
    });
    const me = await signUp(svc);
    const { http } = svc;
    const token = me.key;
    const env = (
      await http.post('/api/environments', {
        token,
        body: { name: 'main', env_vars: { GREETING: 'hello there' }, setup_script: 'echo "ready in $PWD"' },
      })
    ).body;
    const agent = (
      await http.post('/api/agents', {
        token,
        body: {
          name: 'coder',
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: env.id,
          sandbox_provider: 'runner',
        },
      })
    ).body;
    const launch = () =>
      http.post('/api/conversations', {
        token,
        body: { agent_id: agent.id, prompt: 'run a tool and print env GREETING' },
      });

    t.test('no inference credential: 422 missing_credential naming what to set', async (t) => {
      const res = await launch();
      t.equal(res.status, 422);
      t.equal(res.body.error, 'missing_credential');
      t.same(res.body.details, { provider: ['anthropic_api_key', 'claude_code_oauth_token'] });
      t.same((await http.get('/api/conversations', { token })).body.data, [], 'nothing was created');
    });

    t.test('no runner online: 409 no_runner_online', async (t) => {
      const put = await http.put('/api/account/inference-credentials/anthropic_api_key', {
        token,
        body: { value: 'sk-ant-test-credential-123456' },
      });
      t.equal(put.status, 200);
      const res = await launch();
      t.equal(res.status, 409);
      t.equal(res.body.error, 'no_runner_online');
    });

    t.test('first stage to turn end, over SSE, with a real runner and runtime', async (t) => {
      const runner = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
      const root = mkdtempSync(join(tmpdir(), 'svc-launch-root-'));
      const child = spawn(process.execPath, [BIN, '--url', svc.url, '--token', runner.token, '--root', root], {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      child.stdout.on('data', (d) => {
        out += d;
      });
      child.stderr.on('data', (d) => {
        out += d;
      });
      t.teardown(() => child.kill('SIGTERM'));
      for (let i = 0; i < 600 && !/connected as runner/.test(out); i++) await sleep(50);
      t.match(out, /connected as runner/);

      const started = Date.now();
      const res = await launch();
      t.equal(res.status, 201, JSON.stringify(res.body));
      t.match(res.body, { agent_id: agent.id, status: 'running', turn_count: 1 });
      const id = res.body.id as string;
      t.ok(res.body.sandbox_id, 'it names its sandbox');

      const watch = rawGet(svc, `/api/conversations/${id}/stream?blocks=true&last_event_id=0`, {
        authorization: `Bearer ${token}`,
      });
      const ended = await settlesWithin(watch.closed, 30_000);
      t.ok(ended, 'the stream ended by itself at the end of the turn (wait=false)');
      const events = frames(watch.text())
        .map(parseFrame)
        .filter((e) => e.data !== undefined)
        .map((e) => JSON.parse(e.data as string) as WireEvent);
      const stages = events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
      t.same(
        stages,
        [
          'sandbox started',
          'provision started',
          'provision done',
          // Isolated, the sandbox's network is its own loopback and the runner's bridges.
          'network started',
          'network done',
          'broker started',
          'broker done',
          'setup started',
          'setup done',
          'sandbox done',
          'turn started',
          'session started',
          'session done',
          'turn done',
        ],
        'every stage, in order',
      );
      t.match(
        events
          .filter((e) => e.stream === 'stdout')
          .map((e) => e.data)
          .join(''),
        /^ready in .*sandboxes\/sbx_/,
        'the setup script ran in the sandbox',
      );
      const blocks = events.flatMap((e) => e.blocks ?? []);
      const text = blocks
        .filter((b) => b.kind === 'text')
        .map((b) => b.body)
        .join('');
      t.match(text, /You said: run a tool and print env GREETING/, 'the reply, from its streamed chunks');
      t.match(
        text,
        /GREETING=\[REDACTED\]\./,
        "the environment's variable reached the runtime, and being 8 bytes or more it is redacted",
      );
      t.ok(
        blocks.some((b) => b.kind === 'thinking'),
        'a thinking block',
      );
      t.ok(
        blocks.some((b) => b.kind === 'tool_use') && blocks.some((b) => b.kind === 'tool_result'),
        'a tool call and its result',
      );
      const turnEvents = events.filter((e) => e.stream === 'acp' || e.stage === 'turn');
      t.ok(
        turnEvents.every((e) => e.turn_id === turnEvents[0]?.turn_id && e.turn_id),
        'the turn’s events carry its id',
      );
      const ids = events.map((e) => e.id);
      t.ok(
        ids.every((x, i) => i === 0 || x > (ids[i - 1] as number)),
        'ids increase',
      );

      // The record follows the log: the turn ended done with the usage the runtime reported.
      let turns: { state: string; usage: { input: number; output: number } | null }[] = [];
      for (let i = 0; i < 100; i++) {
        turns = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data;
        if (turns[0]?.state !== 'running') break;
        await sleep(50);
      }
      t.equal(
        turns[0]?.state,
        'done',
        `runner said: ${out}\nlog: ${JSON.stringify((await http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data.slice(-4))}`,
      );
      t.match(turns[0]?.usage, { input: 'run a tool and print env GREETING'.length });
      t.ok((turns[0]?.usage?.output ?? 0) > 0, 'output tokens as reported');
      const conv = (await http.get(`/api/conversations/${id}`, { token })).body;
      t.match(conv, { status: 'idle', usage_total: { input: 'run a tool and print env GREETING'.length } });
      t.comment(`first event to turn end took ${Date.now() - started} ms`);
    });

    t.test(
      'a runner killed mid-turn: after the grace its turn ends failed, visibly; nothing stays running',
      async (t) => {
        const runner = (await http.post('/api/runners', { token, body: { name: 'doomed' } })).body;
        const root = mkdtempSync(join(tmpdir(), 'svc-launch-root-'));
        const child = spawn(process.execPath, [BIN, '--url', svc.url, '--token', runner.token, '--root', root], {
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let out = '';
        child.stdout.on('data', (d) => {
          out += d;
        });
        t.teardown(() => child.kill('SIGKILL'));
        for (let i = 0; i < 600 && !/connected as runner/.test(out); i++) await sleep(50);
        const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'be slow' } });
        t.equal(res.status, 201);
        const id = res.body.id as string;
        const feed = async () =>
          (await http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as WireEvent[];
        for (let i = 0; i < 300 && !(await feed()).some((e) => e.stream === 'acp'); i++) await sleep(50);
        t.ok(
          (await feed()).some((e) => e.stream === 'acp'),
          'the turn is under way',
        );
        child.kill('SIGKILL');
        let turns: { state: string }[] = [];
        for (let i = 0; i < 600; i++) {
          turns = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data;
          if (turns[0]?.state !== 'running') break;
          await sleep(50);
        }
        t.equal(turns[0]?.state, 'failed', 'the turn failed once the grace ran out');
        t.match(turns[0], { error: { code: 'runner_offline', message: /runner/ } }, 'its record says why');
        for (let i = 0; i < 100 && !(await feed()).some((e) => e.stage === 'turn' && e.state === 'failed'); i++) {
          await sleep(50);
        }
        const end = (await feed()).find((e) => e.stage === 'turn' && e.state === 'failed');
        t.match(
          JSON.parse(end?.data ?? '{}'),
          { code: 'runner_offline', error: /runner went offline/ },
          'and says why in the log',
        );
        t.match((await http.get(`/api/conversations/${id}`, { token })).body, { status: 'idle' });
        const [sandbox] = await svc.db.sql<
          { status: string }[]
        >`SELECT status FROM sandboxes WHERE id = ${res.body.sandbox_id}`;
        t.equal(sandbox?.status, 'failed', 'its sandbox is failed');
      },
    );

    t.test('the local provider (the instance default) starts a runner-agent for the sandbox', async (t) => {
      const localAgent = (
        await http.post('/api/agents', {
          token,
          body: {
            name: 'local coder',
            runtime: 'claude',
            model: 'anthropic/claude-sonnet-4-5',
            environment_id: env.id,
          },
        })
      ).body;
      const before = (await http.get('/api/runners', { token })).body.data.length;
      const res = await http.post('/api/conversations', {
        token,
        body: { agent_id: localAgent.id, prompt: 'hello from local' },
      });
      t.equal(res.status, 201, JSON.stringify(res.body));
      const watch = rawGet(svc, `/api/conversations/${res.body.id}/stream?blocks=true&last_event_id=0`, {
        authorization: `Bearer ${token}`,
      });
      t.ok(await settlesWithin(watch.closed, 40_000), 'the turn ended');
      const events = frames(watch.text())
        .map(parseFrame)
        .filter((e) => e.data !== undefined)
        .map((e) => JSON.parse(e.data as string) as WireEvent);
      t.same(
        events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`),
        [
          'sandbox started',
          'provision started',
          'provision done',
          // Isolated, the sandbox's network is its own loopback and the runner's bridges.
          'network started',
          'network done',
          'broker started',
          'broker done',
          'setup started',
          'setup done',
          'sandbox done',
          'turn started',
          'session started',
          'session done',
          'turn done',
        ],
      );
      const text = events
        .flatMap((e) => e.blocks ?? [])
        .filter((b) => b.kind === 'text')
        .map((b) => b.body)
        .join('');
      t.match(text, /You said: hello from local/);
      t.equal((await http.get('/api/runners', { token })).body.data.length, before, 'local runners are not listed');
      t.equal(svc.local.running, 1, 'one runner-agent child for the sandbox');
    });

    t.test('a vault secret the runtime streams in pieces is [REDACTED] in every feed and in Postgres', async (t) => {
      // Quotes and a backslash: the value also has a JSON-escaped form in every feed.
      const secret = 'vault-"tok"\\en-0123456789';
      const escaped = JSON.stringify(secret).slice(1, -1);
      const vault = (await http.post('/api/vaults', { token, body: { name: 'spelled' } })).body;
      await http.post(`/api/vaults/${vault.id}/secrets`, { token, body: { key: 'API_TOKEN', value: secret } });
      const spellAgent = (
        await http.post('/api/agents', {
          token,
          body: { name: 'speller', runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment_id: env.id },
        })
      ).body;
      const res = await http.post('/api/conversations', {
        token,
        body: { agent_id: spellAgent.id, vault_id: vault.id, prompt: 'spell env API_TOKEN' },
      });
      t.equal(res.status, 201, JSON.stringify(res.body));
      const id = res.body.id as string;
      const sse = async () => {
        const watch = rawGet(svc, `/api/conversations/${id}/stream?blocks=true&last_event_id=0`, {
          authorization: `Bearer ${token}`,
        });
        t.ok(await settlesWithin(watch.closed, 40_000), 'the stream ended');
        const raw = frames(watch.text()).join('\n\n');
        const events = frames(watch.text())
          .map(parseFrame)
          .filter((e) => e.data !== undefined)
          .map((e) => JSON.parse(e.data as string) as WireEvent);
        return { raw, events };
      };
      const live = await sse();
      // stderr has a pipe of its own: its line may reach the log after the turn's end.
      const feed = (query = '') => http.get(`/api/conversations/${id}/events?limit=1000${query}`, { token });
      for (let i = 0; i < 200; i++) {
        const data = (await feed()).body.data as WireEvent[];
        if (data.some((e) => e.stream === 'stderr' && e.data?.endsWith('\n'))) break;
        await sleep(50);
      }
      const replay = await sse();
      const plain = await feed();
      const withBlocks = await feed('&blocks=true');
      let rows: { stream: string; data: string | null }[] = [];
      for (let i = 0; i < 200; i++) {
        rows = await svc.db.sql`SELECT stream, data FROM log_events WHERE conversation_id = ${id} ORDER BY id`;
        if (rows.length === plain.body.data.length) break;
        await sleep(50);
      }
      t.equal(rows.length, plain.body.data.length, 'the copy holds every event');
      const feeds: [string, string][] = [
        ['the live SSE stream', live.raw],
        ['the SSE replay', replay.raw],
        ['the JSON feed', plain.text],
        ['the JSON feed with blocks', withBlocks.text],
        ['the Postgres copy', rows.map((r) => r.data ?? '').join('\n')],
      ];
      for (const [name, text] of feeds) {
        t.notOk(text.includes(secret) || text.includes(escaped), `${name} never carries the value`);
        t.notOk(text.includes('0123456789'), `${name} never carries its last pieces joined`);
        t.ok(text.includes('[REDACTED]'), `${name} says [REDACTED]`);
      }
      t.ok(live.events.filter((e) => e.stream === 'acp').length > 10, 'the value came as many small chunks');
      for (const events of [replay.events, withBlocks.body.data as WireEvent[]]) {
        const blocks = events.flatMap((e) => e.blocks ?? []);
        const joined = (kind: string) =>
          blocks
            .filter((b) => b.kind === kind)
            .map((b) => b.body)
            .join('');
        t.equal(joined('text'), 'API_TOKEN=[REDACTED]. You said: spell env API_TOKEN.', 'the reply reads whole');
        t.equal(
          joined('thinking'),
          'thinking about: spell env API_TOKENspelling API_TOKEN=[REDACTED]',
          'and the thoughts',
        );
        t.equal(
          events
            .filter((e) => e.stream === 'stderr')
            .map((e) => e.data)
            .join(''),
          'spelled API_TOKEN=[REDACTED]\n',
          'and stderr',
        );
      }
    });
  });
}
