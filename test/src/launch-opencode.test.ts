// A conversation on the `opencode` runtime end to end with the real agent: the server, a real
// svc-runner process, `opencode acp`, and a local fake of the OpenAI Responses API.
import { execFileSync } from 'node:child_process';
import { dirname, join } from 'node:path';
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

// opencode-ai's own bin is a stub its postinstall script replaces; the binary itself comes in
// the platform package it depends on (optionally), usable without any script.
const OPENCODE = join(
  dirname(fileURLToPath(import.meta.resolve('opencode-linux-x64/package.json'))),
  'bin',
  'opencode',
);
const KEY = 'sk-proj-end-to-end-fake-openai-key';
const PROMPT = 'Who are you? Answer in one line.';
const SYSTEM = 'You answer as the release captain of project Quokka.';
const REPLY = 'I am the release captain of project Quokka.';

/** What keeps opencode off the internet: no models.dev catalogue fetch, no self-update, no plugin or LSP downloads. */
const OPENCODE_OFFLINE = {
  OPENCODE_DISABLE_MODELS_FETCH: '1',
  OPENCODE_DISABLE_AUTOUPDATE: '1',
  OPENCODE_DISABLE_DEFAULT_PLUGINS: '1',
  OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
};

/** An opencode conversation on a runner started with `runnerArgs`, checked from launch to what the API received. */
async function opencodeConversation(t: Test, runnerArgs: string[]) {
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
    RUNTIME_OPENCODE_COMMAND: `${OPENCODE} acp`,
    // The credential check on PUT pings the same fake, and the runtime is sent to it.
    OPENAI_BASE_URL: fake.url,
  });
  const { token, agent } = await accountWithAgent(t, svc, {
    credential: 'openai_api_key',
    key: KEY,
    environment: { name: 'oc', env_vars: OPENCODE_OFFLINE },
    agent: { name: 'oc coder', runtime: 'opencode', model: 'openai/gpt-5.4', system: SYSTEM },
  });
  const runner = await startRunnerAgent(t, svc, token, () => fake.close(), runnerArgs);

  const started = Date.now();
  const run = await launchAndWatch(svc, token, agent.id, PROMPT);
  const turn = await checkPlainTurn(t, svc, token, run, {
    reply: REPLY,
    thinking: 'Introduce myself.',
    log: runner.output,
  });
  t.ok(turn?.usage && turn.usage.input > 0 && turn.usage.output > 0, 'usage as opencode reported it');

  // What reached the model API. opencode also asks its small model for a title, separately.
  const calls = fake.responses().filter((c) => c.body?.model === 'gpt-5.4');
  t.equal(calls.length, 1, "one Responses API call with the agent's model");
  const call = calls[0];
  t.match(inputText(call?.body, 'user'), PROMPT, 'the prompt');
  // As developer (or system) messages with an API key; opencode moves the same text into
  // `instructions` when it is signed in to OpenAI by OAuth.
  const system = [
    inputText(call?.body, 'developer'),
    inputText(call?.body, 'system'),
    call?.body?.instructions ?? '',
  ].join('\n');
  // What the call held, shown if either check fails.
  const held = {
    keys: Object.keys(call?.body ?? {}),
    input: Array.isArray(call?.body?.input) ? call.body.input.map((i) => `${i.type ?? 'message'}:${i.role ?? ''}`) : [],
  };
  t.match(system, 'You are OpenCode', 'opencode keeps its own prompt', held);
  t.match(system, SYSTEM, "the agent's system prompt, as instructions after it", held);
  t.ok(
    fake.responses().every((c) => c.headers.authorization === `Bearer ${KEY}`),
    'the account’s credential as the bearer token',
  );
  t.comment(`launch to turn end took ${Date.now() - started} ms`);
}

t.test('an opencode conversation runs opencode acp on a real svc-runner, watched over SSE', (t) =>
  opencodeConversation(t, []),
);

t.test(
  'with --run-as, opencode runs as that user and reads the system prompt the runner wrote for it',
  { skip: process.getuid?.() === 0 ? false : 'needs root (processes as another user)' },
  (t) => {
    execFileSync('id', ['-u', 'nobody'], { stdio: 'ignore' });
    return opencodeConversation(t, ['--run-as', 'nobody']);
  },
);
