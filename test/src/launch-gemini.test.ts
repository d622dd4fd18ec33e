// A conversation on the `gemini` runtime end to end with the real agent: the server, a real
// svc-runner process, `gemini --experimental-acp`, and a local fake of the Gemini API.
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { contentText, startFakeGemini, systemText } from './fakes/gemini-generate.ts';
import {
  accountWithAgent,
  checkPlainTurn,
  launchAndWatch,
  serviceForRuntime,
  startRunnerAgent,
} from './real-runtime.ts';

const GEMINI = fileURLToPath(import.meta.resolve('@google/gemini-cli/bundle/gemini.js'));
const KEY = 'AIza-end-to-end-fake-gemini-key';
const PROMPT = 'Who are you? Answer in one line.';
const SYSTEM = 'You answer as the release captain of project Quokka.';
const REPLY = 'I am the release captain of project Quokka.';

/** A gemini conversation on a runner started with `runnerArgs`, checked from launch to what the API received. */
async function geminiConversation(t: Test, runnerArgs: string[]) {
  const fake = await startFakeGemini({
    apiKey: KEY,
    models: ['gemini-2.5-pro'],
    reply: () => ({ parts: [{ thought: 'Introduce myself.' }, { text: REPLY }] }),
  });
  const svc = await serviceForRuntime(t, {
    RUNTIME_GEMINI_COMMAND: `${process.execPath} ${GEMINI} --experimental-acp`,
    // The credential check on PUT pings the same fake, and the runtime is sent to it.
    GEMINI_BASE_URL: fake.url,
  });
  const { token, agent } = await accountWithAgent(t, svc, {
    credential: 'gemini_api_key',
    key: KEY,
    validated: { seen: () => fake.seen.map((r) => `${r.method} ${r.path}`), expected: ['GET /v1beta/models'] },
    environment: { name: 'gem' },
    agent: { name: 'gem coder', runtime: 'gemini', model: 'google/gemini-2.5-pro', system: SYSTEM },
  });
  const runner = await startRunnerAgent(t, svc, token, () => fake.close(), runnerArgs);

  const started = Date.now();
  const run = await launchAndWatch(svc, token, agent.id, PROMPT);
  await checkPlainTurn(t, svc, token, run, { reply: REPLY, thinking: 'Introduce myself.', log: runner.output });

  // What reached the model API: the model (in the path), the prompt, the system prompt, the key.
  const calls = fake.streams();
  t.equal(calls.length, 1, 'one streamGenerateContent call');
  const call = calls[0];
  t.equal(call?.model, 'gemini-2.5-pro', "the agent's model, as Gemini CLI names it");
  t.match(contentText(call?.body, 'user'), PROMPT, 'the prompt');
  t.match(systemText(call?.body), 'Gemini CLI', 'Gemini CLI keeps its own system prompt');
  t.match(systemText(call?.body), SYSTEM, "the agent's system prompt, after it (from ~/.gemini/GEMINI.md)");
  t.ok(
    fake.seen.every((c) => c.headers['x-goog-api-key'] === KEY),
    'the account’s credential as x-goog-api-key',
  );
  t.comment(`launch to turn end took ${Date.now() - started} ms`);
}

t.test('a gemini conversation runs gemini --experimental-acp on a real svc-runner, watched over SSE', (t) =>
  geminiConversation(t, []),
);

t.test(
  'with --run-as, Gemini CLI runs as that user and reads the system prompt the runner wrote for it',
  { skip: process.getuid?.() === 0 ? false : 'needs root (processes as another user)' },
  (t) => {
    execFileSync('id', ['-u', 'nobody'], { stdio: 'ignore' });
    return geminiConversation(t, ['--run-as', 'nobody']);
  },
);
