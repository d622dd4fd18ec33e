// A conversation on the `codex` runtime end to end with the real adapter: the server, a real
// svc-runner process, codex-acp (Codex built in), and a local fake of the OpenAI Responses API.
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { inputText, startFakeOpenAI } from './fakes/openai-responses.ts';
import {
  accountWithAgent,
  checkPlainTurn,
  launchAndWatch,
  serviceForRuntime,
  startRunnerAgent,
} from './real-runtime.ts';

// The launcher runs the prebuilt binary of @zed-industries/codex-acp-linux-x64 (an optional
// dependency; no install script is needed).
const CODEX_ACP = fileURLToPath(import.meta.resolve('@zed-industries/codex-acp/bin/codex-acp.js'));
const KEY = 'sk-proj-end-to-end-fake-openai-key';
const PROMPT = 'Who are you? Answer in one line.';
// Quotes, a backslash and a line break: it reaches Codex as a TOML string on its command line.
const SYSTEM = 'You answer as the release captain of project "Quokka".\nSign off with \\o/.';
const REPLY = 'I am the release captain of project Quokka. \\o/';

/** A codex conversation on a runner started with `runnerArgs`, checked from launch to what the API received. */
async function codexConversation(t: Test, runnerArgs: string[]) {
  const fake = await startFakeOpenAI({
    apiKey: KEY,
    models: ['gpt-5.4'],
    reply: () => ({
      output: [
        { type: 'reasoning', summary: 'Introduce myself.' },
        { type: 'text', text: REPLY },
      ],
    }),
  });
  const svc = await serviceForRuntime(t, {
    RUNTIME_CODEX_COMMAND: `${process.execPath} ${CODEX_ACP}`,
    // The credential check on PUT pings the same fake, and the runtime is sent to it: the
    // environment names no endpoint of its own.
    OPENAI_BASE_URL: fake.url,
  });
  const { token, agent } = await accountWithAgent(t, svc, {
    credential: 'openai_api_key',
    key: KEY,
    validated: { seen: () => fake.seen.map((r) => `${r.method} ${r.path}`), expected: ['GET /v1/models'] },
    environment: { name: 'codex' },
    agent: {
      name: 'codex coder',
      runtime: 'codex',
      // A model Codex 0.128 knows: for others it writes a "model metadata not found" warning
      // into the reply.
      model: 'openai/gpt-5.4',
      system: SYSTEM,
    },
  });
  const runner = await startRunnerAgent(t, svc, token, () => fake.close(), runnerArgs);

  const started = Date.now();
  const run = await launchAndWatch(svc, token, agent.id, PROMPT);
  await checkPlainTurn(t, svc, token, run, { reply: REPLY, thinking: 'Introduce myself.', log: runner.output });

  // What reached the model API: the prompt, the model, the system prompt and the key.
  const calls = fake.responses();
  t.equal(calls.length, 1, 'one Responses API call');
  const call = calls[0];
  t.match(inputText(call?.body, 'user'), PROMPT, 'the prompt');
  t.equal(call?.body?.model, 'gpt-5.4', "the agent's model, as Codex names it");
  t.ok(call?.body?.instructions?.includes('Codex'), 'Codex keeps its own instructions');
  t.ok(inputText(call?.body, 'developer').includes(SYSTEM), "the agent's system prompt, as developer instructions");
  t.equal(call?.headers.authorization, `Bearer ${KEY}`, 'the account’s credential as the bearer token');
  t.comment(`launch to turn end took ${Date.now() - started} ms`);
}

t.test('a codex conversation runs codex-acp on a real svc-runner, watched over SSE', (t) => codexConversation(t, []));

t.test(
  'with --run-as, codex-acp runs as that user, its Codex home in the sandbox',
  { skip: process.getuid?.() === 0 ? false : 'needs root (processes as another user)' },
  (t) => {
    execFileSync('id', ['-u', 'nobody'], { stdio: 'ignore' });
    return codexConversation(t, ['--run-as', 'nobody']);
  },
);
