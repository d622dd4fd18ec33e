// A conversation on the `codex` runtime end to end with the real adapter: the server, a real
// svc-runner process, codex-acp (Codex built in), and a local fake of the OpenAI Responses API.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { inputText, startFakeOpenAI } from './fakes/openai-responses.ts';
import { signUp, startTestService } from './harness.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A deadline that does not keep the process alive once the test is done. */
const deadline = (ms: number) => new Promise((r) => setTimeout(r, ms).unref());
const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));
// The launcher picks the prebuilt binary of @zed-industries/codex-acp-linux-x64 (an optional
// dependency; no install script is needed).
const CODEX_ACP = fileURLToPath(import.meta.resolve('@zed-industries/codex-acp/bin/codex-acp.js'));
const KEY = 'sk-proj-end-to-end-fake-openai-key';
const PROMPT = 'Who are you? Answer in one line.';
const SYSTEM = 'You answer as the release captain of project Quokka.';

interface WireEvent {
  id: number;
  kind: string;
  stream: string;
  data: string | null;
  stage: string | null;
  state: string | null;
  turn_id: string | null;
  blocks?: { kind: string; body?: string; name?: string }[];
}

t.test('a codex conversation runs codex-acp on a real svc-runner, watched over SSE', async (t) => {
  const fake = await startFakeOpenAI({
    apiKey: KEY,
    models: ['gpt-5.4'],
    reply: () => ({
      output: [
        { type: 'reasoning', summary: 'Introduce myself as configured.' },
        { type: 'text', text: 'I am the release captain of project Quokka.' },
      ],
    }),
  });
  const svc = await startTestService(t, {
    env: {
      RUNNER_HEARTBEAT_MS: '500',
      RUNNER_GRACE_MS: '5000',
      RUNTIME_CODEX_COMMAND: `${process.execPath} ${CODEX_ACP}`,
      // The credential check on PUT pings the same fake, and the runtime is sent to it: the
      // environment names no endpoint of its own.
      OPENAI_BASE_URL: fake.url,
      SSE_IDLE_CLOSE_MS: '30000',
    },
  });
  const { http } = svc;
  const { key: token } = await signUp(svc);

  const put = await http.put('/api/account/inference-credentials/openai_api_key', {
    token,
    body: { value: KEY, validate: true },
  });
  t.equal(put.status, 200, JSON.stringify(put.body));
  t.same(
    fake.seen.map((r) => `${r.method} ${r.path}`),
    ['GET /v1/models'],
    'the credential was validated against the fake',
  );
  const env = (await http.post('/api/environments', { token, body: { name: 'codex' } })).body;
  const agent = (
    await http.post('/api/agents', {
      token,
      body: {
        name: 'codex coder',
        runtime: 'codex',
        // A model Codex 0.128 knows: for others it prints a "model metadata not found" warning
        // into the reply.
        model: 'openai/gpt-5.4',
        environment_id: env.id,
        sandbox_provider: 'runner',
        system: SYSTEM,
      },
    })
  ).body;
  t.ok(agent.id, JSON.stringify(agent));

  const runner = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const root = mkdtempSync(join(tmpdir(), 'svc-codex-root-'));
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
  t.teardown(async () => {
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    await Promise.race([exited, deadline(5000)]);
    await fake.close();
    rmSync(root, { recursive: true, force: true, maxRetries: 3 });
  });
  for (let i = 0; i < 600 && !/connected as runner/.test(out); i++) await sleep(50);
  t.match(out, /connected as runner/);

  const started = Date.now();
  const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: PROMPT } });
  t.equal(res.status, 201, JSON.stringify(res.body));
  const id = res.body.id as string;
  const watch = rawGet(svc, `/api/conversations/${id}/stream?blocks=true&last_event_id=0`, {
    authorization: `Bearer ${token}`,
  });
  const ended = await Promise.race([watch.closed.then(() => true), deadline(60_000).then(() => false)]);
  t.ok(ended, 'the stream ended by itself at the end of the turn');
  const events = frames(watch.text())
    .map(parseFrame)
    .filter((e) => e.data !== undefined)
    .map((e) => JSON.parse(e.data as string) as WireEvent);
  const log = () => `runner said: ${out}\nlast events: ${JSON.stringify(events.slice(-4))}`;
  t.same(
    events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`),
    [
      'sandbox started',
      'provision started',
      'provision done',
      'sandbox done',
      'turn started',
      'session started',
      'session done',
      'turn done',
    ],
    `every stage, in order; ${log()}`,
  );
  const turnEnd = events.find((e) => e.stage === 'turn' && e.state === 'done');
  t.match(JSON.parse(turnEnd?.data ?? '{}'), { stop_reason: 'end_turn' }, log());

  const blocks = events.flatMap((e) => e.blocks ?? []);
  t.equal(
    blocks
      .filter((b) => b.kind === 'text')
      .map((b) => b.body)
      .join(''),
    'I am the release captain of project Quokka.',
    'the reply, rebuilt from its streamed chunks',
  );
  t.match(
    blocks
      .filter((b) => b.kind === 'thinking')
      .map((b) => b.body)
      .join(''),
    'Introduce myself as configured.',
    'the reasoning summary, as thinking',
  );

  // What reached the model API: the prompt, the model, the system prompt and the key.
  const calls = fake.responses();
  t.equal(calls.length, 1, 'one Responses API call');
  const call = calls[0];
  t.match(inputText(call?.body, 'user'), PROMPT, 'the prompt');
  t.equal(call?.body?.model, 'gpt-5.4', "the agent's model, as Codex names it");
  t.ok(call?.body?.instructions?.includes('Codex'), 'Codex keeps its own instructions');
  t.match(inputText(call?.body, 'developer'), SYSTEM, "the agent's system prompt, as developer instructions");
  t.equal(call?.headers.authorization, `Bearer ${KEY}`, 'the account’s credential as the bearer token');

  // The record follows the log: done, and the reply text stored with it.
  let turns: { state: string }[] = [];
  for (let i = 0; i < 100; i++) {
    turns = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data;
    if (turns[0]?.state !== 'running') break;
    await sleep(50);
  }
  t.equal(turns[0]?.state, 'done', log());
  t.comment(`launch to turn end took ${Date.now() - started} ms`);
});
