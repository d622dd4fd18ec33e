// A conversation on the `codex` runtime end to end with the real adapter: the server, a real
// svc-runner process, codex-acp (Codex built in), and a local fake of the OpenAI Responses API.
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { inputText, startFakeOpenAI } from './fakes/openai-responses.ts';
import { signUp, startTestService } from './harness.ts';
import { blockText, launchAndWatch, settledTurn, startRunnerAgent } from './real-runtime.ts';

// The launcher runs the prebuilt binary of @zed-industries/codex-acp-linux-x64 (an optional
// dependency; no install script is needed).
const CODEX_ACP = fileURLToPath(import.meta.resolve('@zed-industries/codex-acp/bin/codex-acp.js'));
const KEY = 'sk-proj-end-to-end-fake-openai-key';
const PROMPT = 'Who are you? Answer in one line.';
// Quotes, a backslash and a line break: it reaches Codex as a TOML string on its command line.
const SYSTEM = 'You answer as the release captain of project "Quokka".\nSign off with \\o/.';

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
        // A model Codex 0.128 knows: for others it writes a "model metadata not found" warning
        // into the reply.
        model: 'openai/gpt-5.4',
        environment_id: env.id,
        sandbox_provider: 'runner',
        system: SYSTEM,
      },
    })
  ).body;
  t.ok(agent.id, JSON.stringify(agent));
  const runner = await startRunnerAgent(t, svc, token, () => fake.close());

  const started = Date.now();
  const { id, ended, events } = await launchAndWatch(svc, token, agent.id, PROMPT);
  t.ok(ended, 'the stream ended by itself at the end of the turn');
  const log = () => `runner said: ${runner.output()}\nlast events: ${JSON.stringify(events.slice(-4))}`;
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
    'every stage, in order',
  );
  const turnEnd = events.find((e) => e.stage === 'turn' && e.state === 'done');
  t.match(JSON.parse(turnEnd?.data ?? '{}'), { stop_reason: 'end_turn' }, log());
  t.equal(
    blockText(events, 'text'),
    'I am the release captain of project Quokka.',
    'the reply, rebuilt from its streamed chunks',
  );
  t.match(blockText(events, 'thinking'), 'Introduce myself as configured.', 'the reasoning summary, as thinking');

  // What reached the model API: the prompt, the model, the system prompt and the key.
  const calls = fake.responses();
  t.equal(calls.length, 1, 'one Responses API call');
  const call = calls[0];
  t.match(inputText(call?.body, 'user'), PROMPT, 'the prompt');
  t.equal(call?.body?.model, 'gpt-5.4', "the agent's model, as Codex names it");
  t.ok(call?.body?.instructions?.includes('Codex'), 'Codex keeps its own instructions');
  t.match(inputText(call?.body, 'developer'), SYSTEM, "the agent's system prompt, as developer instructions");
  t.equal(call?.headers.authorization, `Bearer ${KEY}`, 'the account’s credential as the bearer token');

  t.equal((await settledTurn(svc, token, id))?.state, 'done', log());
  t.comment(`launch to turn end took ${Date.now() - started} ms`);
});
