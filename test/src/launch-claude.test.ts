// A conversation on the `claude` runtime end to end with the real adapter: the server, a real
// svc-runner process, claude-agent-acp and Claude Code, and a local fake of the Anthropic API.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { claudeCodeEnv, type MessagesBody, startFakeAnthropic, textOf } from './fakes/anthropic-messages.ts';
import {
  accountWithAgent,
  blockText,
  launchAndWatch,
  serviceForRuntime,
  settledTurn,
  startRunnerAgent,
} from './real-runtime.ts';

const CLAUDE_ACP = fileURLToPath(import.meta.resolve('@zed-industries/claude-agent-acp/dist/index.js'));
const KEY = 'sk-ant-api03-end-to-end-fake-key';
const PROMPT = 'Create the marker file, then tell me you did.';

const toolResultsOf = (body: MessagesBody) => {
  const content = body.messages?.at(-1)?.content;
  return typeof content === 'string' ? [] : (content ?? []).filter((b) => b.type === 'tool_result');
};

t.test('a claude conversation runs claude-agent-acp on a real svc-runner, watched over SSE', async (t) => {
  const fake = await startFakeAnthropic({
    apiKey: KEY,
    models: ['claude-sonnet-4-5'],
    // First a Bash call that needs permission (the runner answers it), then the reply.
    reply: (body) =>
      toolResultsOf(body).length === 0
        ? {
            content: [
              { type: 'thinking', thinking: 'A file, then a reply.' },
              { type: 'tool_use', name: 'Bash', input: { command: 'touch marker.txt', description: 'Create marker' } },
            ],
          }
        : { content: [{ type: 'text', text: 'Done: the marker file exists now.' }] },
  });
  const svc = await serviceForRuntime(t, {
    RUNTIME_CLAUDE_COMMAND: `${process.execPath} ${CLAUDE_ACP}`,
    // The credential check on PUT pings the same fake.
    ANTHROPIC_BASE_URL: fake.url,
  });
  const { token, agent } = await accountWithAgent(t, svc, {
    credential: 'anthropic_api_key',
    key: KEY,
    validated: { seen: () => fake.seen.map((r) => `${r.method} ${r.path}`), expected: ['GET /v1/models'] },
    // The runtime reaches the fake through the environment's variables.
    environment: { name: 'claude', env_vars: claudeCodeEnv(fake.url) },
    agent: {
      name: 'claude coder',
      runtime: 'claude',
      model: 'anthropic/claude-sonnet-4-5',
      system: 'You answer as the release captain of project Quokka.',
    },
  });

  const runner = await startRunnerAgent(t, svc, token, () => fake.close());

  const started = Date.now();
  const { id, sandboxId, ended, events } = await launchAndWatch(svc, token, agent.id, PROMPT);
  t.ok(ended, 'the stream ended by itself at the end of the turn');
  const log = () => `runner said: ${runner.output()}\nlast events: ${JSON.stringify(events.slice(-4))}`;
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
      'sandbox done',
      'turn started',
      'session started',
      'session done',
      // The Bash call's permission request, answered by the policy (auto_allow) and logged.
      'request done',
      'turn done',
    ],
    'every stage, in order',
  );
  const turnEnd = events.find((e) => e.stage === 'turn' && e.state === 'done');
  t.match(JSON.parse(turnEnd?.data ?? '{}'), { stop_reason: 'end_turn' }, log());

  const blocks = events.flatMap((e) => e.blocks ?? []);
  t.equal(
    blockText(events, 'text'),
    'Done: the marker file exists now.',
    'the reply, rebuilt from its streamed chunks',
  );
  t.equal(blockText(events, 'thinking'), 'A file, then a reply.', 'the thinking');
  t.ok(
    blocks.some((b) => b.kind === 'tool_use') && blocks.some((b) => b.kind === 'tool_result'),
    'the tool call and its result',
  );

  // What reached the model API: the prompt, the model, the key, and the tool's result.
  const calls = fake.messages();
  t.equal(calls.length, 2, 'two Messages API calls: the tool_use, then the reply');
  t.match(textOf(calls[0]?.body?.messages?.at(-1)?.content), PROMPT, 'the prompt');
  t.same([...new Set(calls.map((c) => c.body?.model))], ['claude-sonnet-4-5'], "the agent's model");
  t.ok(
    calls.every((c) => JSON.stringify(c.body?.system ?? '').includes('release captain of project Quokka')),
    "the agent's system prompt, appended to Claude Code's",
  );
  t.ok(
    calls.every((c) => c.headers['x-api-key'] === KEY),
    'the account’s credential as x-api-key',
  );
  t.match(toolResultsOf(calls[1]?.body ?? {}), [{ is_error: false }], 'the runner allowed the Bash call');
  t.ok(existsSync(join(runner.root, 'sandboxes', sandboxId, 'marker.txt')), 'which ran in the sandbox');

  // The record follows the log: done, with the usage Claude Code reported.
  const turn = await settledTurn(svc, token, id);
  t.equal(turn?.state, 'done', log());
  t.match(turn?.usage, { input: fake.usageSent.input, output: fake.usageSent.output }, 'usage as the API reported');
  t.match(
    turn,
    { reply: 'Done: the marker file exists now.', error: null, ended_at: String },
    'the reply on the record, no error, and when it ended',
  );
  t.comment(`launch to turn end took ${Date.now() - started} ms`);
});
