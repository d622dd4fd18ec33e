// A failing turn says why, at once: the real claude-agent-acp on a real svc-runner, against a
// local fake of the Anthropic API that refuses the key, an address where nothing listens, and
// an agent command that is not installed. Each turn must end `failed` well before a runtime's
// own retries would give up (minutes), with a code and a message on its record and its stream.
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { claudeCodeEnv, startFakeAnthropic } from './fakes/anthropic-messages.ts';
import { startFakeOpenAI } from './fakes/openai-responses.ts';
import { signUp, startTestService } from './harness.ts';
import { accountWithAgent, launchAndWatch, serviceForRuntime, settledTurn, startRunnerAgent } from './real-runtime.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import type { WireEvent } from './sse-client.ts';

const CLAUDE_ACP = fileURLToPath(import.meta.resolve('@zed-industries/claude-agent-acp/dist/index.js'));
const CODEX_ACP = fileURLToPath(import.meta.resolve('@zed-industries/codex-acp/bin/codex-acp.js'));
const KEY = 'sk-ant-api03-the-one-key-the-fake-takes';

/** A local address where nothing listens (a port just freed). */
async function closedPort(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

const stages = (events: WireEvent[]) => events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
const dataOf = (events: WireEvent[], stage: string, state: string) =>
  JSON.parse(events.find((e) => e.stage === stage && e.state === state)?.data ?? '{}');

t.test('a claude turn that its provider refuses or cannot be reached fails at once, saying why', async (t) => {
  const fake = await startFakeAnthropic({
    apiKey: KEY,
    models: ['claude-sonnet-4-5'],
    reply: () => ({ content: [{ type: 'text', text: 'unreachable with a wrong key' }] }),
  });
  const svc = await serviceForRuntime(t, {
    RUNTIME_CLAUDE_COMMAND: `${process.execPath} ${CLAUDE_ACP}`,
    ANTHROPIC_BASE_URL: fake.url,
  });
  // No CLAUDE_CODE_MAX_RETRIES here: the service's bound on Claude Code's retries is what keeps
  // these turns short (its own default is 10 retries with backoff, about three minutes).
  const { token, agent } = await accountWithAgent(t, svc, {
    credential: 'anthropic_api_key',
    key: 'sk-ant-api03-a-key-the-provider-refuses',
    validate: false,
    environment: { name: 'claude', env_vars: claudeCodeEnv(fake.url) },
    agent: { name: 'wrong key', runtime: 'claude', model: 'anthropic/claude-sonnet-4-5' },
  });
  const runner = await startRunnerAgent(t, svc, token, () => fake.close());
  const log = (events: WireEvent[]) => `runner said: ${runner.output()}\nevents: ${JSON.stringify(events.slice(-6))}`;

  t.test('a key the provider refuses is invalid_api_key, on the stream and on the record', async (t) => {
    const run = await launchAndWatch(svc, token, agent.id, 'Hello?');
    t.ok(run.ended, `the turn ended and its stream with it, well within a minute\n${log(run.events)}`);
    t.same(stages(run.events).slice(-3), ['session done', 'model failed', 'turn failed'], log(run.events));
    t.match(dataOf(run.events, 'model', 'failed'), { code: 'invalid_api_key', error: /Anthropic refused the API key/ });
    t.match(dataOf(run.events, 'turn', 'failed'), {
      usage: null,
      code: 'invalid_api_key',
      error: /Anthropic refused the API key \(401\): update the account's inference credential/,
    });
    const calls = fake.messages();
    t.ok(
      calls.length > 0 && calls.every((r) => r.headers['x-api-key'] === 'sk-ant-api03-a-key-the-provider-refuses'),
      'the runtime did call the provider, with the stored key',
    );
    // claude-agent-acp dumps the failed request and its error over 13 lines of stderr: one event now.
    const stderr = run.events.filter((e) => e.stream === 'stderr').map((e) => e.data ?? '');
    const dump = stderr.filter((line) => line.includes('Error handling request'));
    t.equal(dump.length, 1, stderr.join(''));
    t.match(dump[0], /^Error handling request \{ jsonrpc: '2\.0',.*Invalid API key.*\}\n$/, 'folded into one line');
    t.notOk(
      stderr.some((line) => /^\s*(jsonrpc:|code: -32603|\}\n)/.test(line)),
      'no line of it on its own',
    );

    const turn = await settledTurn(svc, token, run.id);
    t.equal(turn?.state, 'failed');
    t.equal(turn?.error?.code, 'invalid_api_key');
    t.match(turn?.error?.message, /inference-credentials/, 'says what to fix');
    t.equal(turn?.reply, '', 'the agent said nothing');
  });

  t.test('a provider nobody answers for is provider_unreachable', async (t) => {
    const nowhere = await closedPort();
    const env = (
      await svc.http.post('/api/environments', { token, body: { name: 'nowhere', env_vars: claudeCodeEnv(nowhere) } })
    ).body;
    const lost = (
      await svc.http.post('/api/agents', {
        token,
        body: {
          name: 'lost',
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: env.id,
          sandbox_provider: 'runner',
        },
      })
    ).body;
    const run = await launchAndWatch(svc, token, lost.id, 'Anyone there?');
    t.ok(run.ended, `the turn ended and its stream with it, well within a minute\n${log(run.events)}`);
    t.same(stages(run.events).slice(-2), ['model failed', 'turn failed'], log(run.events));
    t.match(dataOf(run.events, 'turn', 'failed'), {
      code: 'provider_unreachable',
      error: /could not be reached from the sandbox: check the base URL/,
    });
    const turn = await settledTurn(svc, token, run.id);
    t.match(turn, { state: 'failed', error: { code: 'provider_unreachable', message: /ANTHROPIC_BASE_URL/ } });
  });
});

t.test('an agent command that is not installed fails the turn naming the command and its package', async (t) => {
  const svc = await serviceForRuntime(t, { RUNTIME_CLAUDE_COMMAND: 'claude-agent-acp-not-installed-here' });
  const { token, agent } = await accountWithAgent(t, svc, {
    credential: 'anthropic_api_key',
    key: KEY,
    validate: false,
    environment: { name: 'bare' },
    agent: { name: 'no agent', runtime: 'claude', model: 'anthropic/claude-sonnet-4-5' },
  });
  const runner = await startRunnerAgent(t, svc, token, async () => {});
  const run = await launchAndWatch(svc, token, agent.id, 'Hello?');
  const log = `runner said: ${runner.output()}\nevents: ${JSON.stringify(run.events.slice(-4))}`;
  t.ok(run.ended, log);
  t.same(stages(run.events).slice(-3), ['session started', 'session failed', 'turn failed'], log);
  const end = dataOf(run.events, 'turn', 'failed');
  t.equal(end.code, 'agent_not_installed', log);
  const turn = await settledTurn(svc, token, run.id);
  t.equal(turn?.state, 'failed');
  t.equal(turn?.error?.code, 'agent_not_installed');
  t.match(turn?.error?.message, 'The agent command claude-agent-acp-not-installed-here is not installed');
  t.match(turn?.error?.message, 'npm install -g @zed-industries/claude-agent-acp', 'how to install it');
  t.match(turn?.error?.message, 'RUNTIME_CLAUDE_COMMAND', 'or the setting that points at it');
  t.equal(turn?.error?.message, end.error, 'the record says what the stream said');
});

t.test("a runtime's error that quotes a secret is [REDACTED] on the record as in the log", async (t) => {
  const svc = await startTestService(t, { env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND } });
  const { key: token } = await signUp(svc);
  const { agent } = await claudeOnRunner(t, svc, token);
  const run = await launchAndWatch(svc, token, agent.id, 'refuse env ANTHROPIC_API_KEY');
  t.ok(run.ended, JSON.stringify(run.events.slice(-3)));
  const turn = await settledTurn(svc, token, run.id);
  t.equal(turn?.error?.code, 'invalid_api_key');
  t.match(turn?.error?.message, 'The runtime said: Invalid API key: ANTHROPIC_API_KEY=[REDACTED]');
  // claudeAgent's credential, which the runner put in ANTHROPIC_API_KEY.
  t.notMatch(turn?.error?.message, 'sk-ant-test-credential-123456', 'the key is not on the record');
  t.equal(dataOf(run.events, 'turn', 'failed').error, turn?.error?.message, 'the record says what the log says');
});

t.test('a codex turn says why from its stderr, where codex-acp puts the reason its ACP error leaves out', async (t) => {
  const fake = await startFakeOpenAI({
    apiKey: 'sk-proj-the-one-key-the-fake-takes',
    models: ['gpt-5.4'],
    reply: () => ({ output: [{ type: 'text', text: 'unreachable with a wrong key' }] }),
  });
  const svc = await serviceForRuntime(t, {
    RUNTIME_CODEX_COMMAND: `${process.execPath} ${CODEX_ACP}`,
    OPENAI_BASE_URL: fake.url,
  });
  const { token, agent } = await accountWithAgent(t, svc, {
    credential: 'openai_api_key',
    key: 'sk-proj-a-key-the-provider-refuses',
    validate: false,
    environment: { name: 'codex' },
    agent: { name: 'wrong key', runtime: 'codex', model: 'openai/gpt-5.4' },
  });
  const runner = await startRunnerAgent(t, svc, token, () => fake.close());
  const log = (events: WireEvent[]) => `runner said: ${runner.output()}\nevents: ${JSON.stringify(events.slice(-6))}`;

  t.test('a refused key', async (t) => {
    const run = await launchAndWatch(svc, token, agent.id, 'Hello?');
    t.ok(run.ended, log(run.events));
    t.same(stages(run.events).slice(-2), ['model failed', 'turn failed'], log(run.events));
    const turn = await settledTurn(svc, token, run.id);
    t.equal(turn?.error?.code, 'invalid_api_key', log(run.events));
    t.match(turn?.error?.message, /^OpenAI refused the API key \(401\): .*inference-credentials\/openai_api_key/);
    t.match(turn?.error?.message, /The runtime said: .*401 Unauthorized/, 'quoting the stderr line that said so');
    t.notMatch(turn?.error?.message, '\u001b', 'without its terminal colours');
  });

  t.test('a provider nobody answers for', async (t) => {
    const nowhere = await closedPort();
    const env = (
      await svc.http.post('/api/environments', {
        token,
        body: { name: 'nowhere', env_vars: { OPENAI_BASE_URL: `${nowhere}/v1` } },
      })
    ).body;
    const lost = (
      await svc.http.post('/api/agents', {
        token,
        body: {
          name: 'lost',
          runtime: 'codex',
          model: 'openai/gpt-5.4',
          environment_id: env.id,
          sandbox_provider: 'runner',
        },
      })
    ).body;
    const run = await launchAndWatch(svc, token, lost.id, 'Anyone there?');
    t.ok(run.ended, log(run.events));
    const turn = await settledTurn(svc, token, run.id);
    t.match(
      turn,
      { state: 'failed', error: { code: 'provider_unreachable', message: /OPENAI_BASE_URL/ } },
      log(run.events),
    );
    // codex-acp retried twice (the service's bound), not its default of five.
    const retries = run.events.filter((e) => e.stream === 'stderr' && /Reconnecting\.\.\. \d+\/\d+/.test(e.data ?? ''));
    t.match(retries.at(-1)?.data, /Reconnecting\.\.\. 2\/2/, log(run.events));
  });
});
