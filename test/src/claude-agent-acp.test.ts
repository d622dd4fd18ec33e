// The `claude` runtime with the real adapter: `claude-agent-acp` (and the Claude Code it drives)
// under an AcpRuntime, against a local fake of the Anthropic Messages API.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AcpRuntime, type PermissionAnswer } from 'svc-runner';
import t from 'tap';
import {
  claudeCodeEnv,
  type MessagesBody,
  type Reply,
  startFakeAnthropic,
  textOf,
} from './fakes/anthropic-messages.ts';

const CLAUDE_ACP = fileURLToPath(import.meta.resolve('@zed-industries/claude-agent-acp/dist/index.js'));
const KEY = 'sk-ant-api03-fake-key-for-tests';
const MODEL = 'claude-sonnet-4-5';

type Update = {
  sessionId: string;
  update: {
    sessionUpdate: string;
    content?: { type: string; text?: string };
    toolCallId?: string;
    status?: string;
    kind?: string;
  };
};

const lastMessage = (body: MessagesBody) => body.messages?.at(-1);
/** The tool results the agent sent back in a request's last (user) message. */
const toolResultsOf = (body: MessagesBody) => {
  const content = lastMessage(body)?.content;
  return typeof content === 'string' ? [] : (content ?? []).filter((b) => b.type === 'tool_result');
};

t.test('claude-agent-acp runs turns against the Messages API it is pointed at', async (t) => {
  // What the fake answers next; each subtest sets it.
  let respond: (body: MessagesBody) => Reply = () => ({ content: [{ type: 'text', text: 'unset' }] });
  const fake = await startFakeAnthropic({ apiKey: KEY, reply: (body) => respond(body) });
  t.teardown(() => fake.close());
  const home = mkdtempSync(join(tmpdir(), 'svc-claude-home-'));
  const cwd = mkdtempSync(join(tmpdir(), 'svc-claude-cwd-'));
  t.teardown(() => {
    rmSync(home, { recursive: true, force: true });
    rmSync(cwd, { recursive: true, force: true });
  });
  const updates: Update[] = [];
  const stderr: string[] = [];
  const permissions: unknown[] = [];
  let answer: (request: unknown) => PermissionAnswer = () => ({ outcome: 'cancelled' });
  const runtime = await AcpRuntime.start({
    command: process.execPath,
    args: [CLAUDE_ACP],
    cwd,
    env: { ...claudeCodeEnv(fake.url), HOME: home, ANTHROPIC_API_KEY: KEY, ANTHROPIC_MODEL: MODEL },
    model: MODEL,
    onUpdate: (u) => updates.push(u as Update),
    onStderr: (line) => stderr.push(line),
    onPermission: async (request) => {
      permissions.push(request);
      return answer(request);
    },
  });
  t.teardown(() => runtime.close());

  async function turn(prompt: string) {
    const from = updates.length;
    const requestsBefore = fake.messages().length;
    const usageBefore = { ...fake.usageSent };
    const result = await runtime.prompt(prompt);
    const mine = updates.slice(from);
    const text = (kind: string) =>
      mine
        .filter((u) => u.update.sessionUpdate === kind)
        .map((u) => u.update.content?.text ?? '')
        .join('');
    return {
      ...result,
      updates: mine,
      reply: text('agent_message_chunk'),
      thought: text('agent_thought_chunk'),
      requests: fake.messages().slice(requestsBefore),
      usageSent: {
        input: fake.usageSent.input - usageBefore.input,
        output: fake.usageSent.output - usageBefore.output,
      },
    };
  }

  t.test(
    'the streamed reply arrives as ACP updates; the turn ends end_turn with the usage the API reported',
    async (t) => {
      respond = (body) => ({
        content: [
          { type: 'thinking', thinking: `The user said: ${textOf(lastMessage(body)?.content).includes('forty')}` },
          { type: 'text', text: 'The answer is forty-two, streamed in small pieces.' },
        ],
      });
      const r = await turn('What is six times seven, in words like forty?');
      t.equal(r.stopReason, 'end_turn', `stderr: ${stderr.join('\n')}`);
      t.equal(r.reply, 'The answer is forty-two, streamed in small pieces.', 'the text the fake streamed');
      t.ok(
        r.updates.filter((u) => u.update.sessionUpdate === 'agent_message_chunk' && u.update.content?.text).length > 1,
        'in more than one chunk',
      );
      t.equal(r.thought, 'The user said: true', 'the thinking block as agent_thought_chunk');
      t.ok(
        r.updates.every((u) => u.sessionId === runtime.sessionId),
        'every update names the session',
      );

      t.equal(r.requests.length, 1, 'one Messages API call for a turn without tools');
      const req = r.requests[0];
      t.equal(req?.body?.stream, true, 'streaming');
      t.equal(req?.headers['x-api-key'], KEY, 'with the API key from ANTHROPIC_API_KEY');
      t.ok(req?.headers['anthropic-version'], 'and an anthropic-version header');
      t.match(
        textOf(req?.body ? lastMessage(req.body)?.content : undefined),
        'What is six times seven, in words like forty?',
        'the prompt is in the last user message',
      );
      t.same(
        r.usage,
        { input: r.usageSent.input, output: r.usageSent.output, cache_read: 0, cache_write: 0 },
        'usage on the prompt response: the token counts the API reported',
      );
      t.ok((r.usage?.input ?? 0) > 0 && (r.usage?.output ?? 0) > 0);
    },
  );

  t.test('a tool call round trip: Bash runs in cwd and its output goes back in the next request', async (t) => {
    const toolId = 'toolu_01FakeBashEchoRoundTrip';
    respond = (body) =>
      toolResultsOf(body).length === 0
        ? {
            content: [
              { type: 'text', text: 'Let me check.' },
              {
                type: 'tool_use',
                id: toolId,
                name: 'Bash',
                input: { command: 'echo hi-from-bash', description: 'Echo' },
              },
            ],
          }
        : { content: [{ type: 'text', text: `The command printed: ${textOf(toolResultsOf(body) as never)}` }] };
    const r = await turn('Run echo for me.');
    t.equal(r.stopReason, 'end_turn');
    t.equal(r.requests.length, 2, 'the tool_use answer, then the request carrying its result');
    t.same(
      toolResultsOf(r.requests[1]?.body ?? {}).map((b) => [b.tool_use_id, b.is_error ?? false, textOf([b] as never)]),
      [[toolId, false, 'hi-from-bash']],
      "the next request carries the tool's output as the tool_result of that tool_use id",
    );
    const calls = r.updates.filter((u) => u.update.toolCallId === toolId);
    t.equal(calls[0]?.update.sessionUpdate, 'tool_call', 'a tool_call update first');
    t.equal(calls[0]?.update.kind, 'execute');
    t.equal(calls.at(-1)?.update.status, 'completed', 'then updates to completed');
    t.equal(r.reply, 'Let me check.The command printed: hi-from-bash');
  });

  t.test('a Write asks permission through onPermission: allowed it writes, rejected the model is told', async (t) => {
    const file = join(cwd, 'notes.md');
    respond = (body) =>
      toolResultsOf(body).length === 0
        ? { content: [{ type: 'tool_use', name: 'Write', input: { file_path: file, content: 'written by Claude\n' } }] }
        : { content: [{ type: 'text', text: toolResultsOf(body)[0]?.is_error ? 'It was refused.' : 'Written.' }] };
    answer = (request) => {
      const options = (request as { options: { optionId: string; kind: string }[] }).options;
      const allow = options.find((o) => o.kind === 'allow_once');
      return { outcome: 'selected', optionId: allow?.optionId ?? 'none' };
    };
    const allowed = await turn('Write notes.md');
    t.equal(permissions.length, 1, 'one permission request');
    t.match(permissions[0], {
      sessionId: runtime.sessionId,
      toolCall: { kind: 'edit', rawInput: { file_path: file } },
      options: [{ kind: 'allow_always' }, { kind: 'allow_once' }, { kind: 'reject_once' }],
    });
    t.equal(allowed.reply, 'Written.');
    t.equal(readFileSync(file, 'utf8'), 'written by Claude\n', 'the file was written in cwd');

    rmSync(file);
    answer = (request) => {
      const options = (request as { options: { optionId: string; kind: string }[] }).options;
      return { outcome: 'selected', optionId: options.find((o) => o.kind === 'reject_once')?.optionId ?? 'none' };
    };
    const rejected = await turn('Write notes.md again');
    t.equal(permissions.length, 2, 'asked again');
    t.equal(rejected.reply, 'It was refused.');
    t.notOk(existsSync(file), 'nothing was written');
    t.match(toolResultsOf(rejected.requests[1]?.body ?? {})[0], { is_error: true }, 'the tool_result is an error');
  });

  t.test("the agent's model is the one every request names", async (t) => {
    t.ok(fake.messages().length >= 5);
    t.same([...new Set(fake.messages().map((r) => r.body?.model))], [MODEL]);
  });

  t.test('nothing but the Messages API was called, with the key each time', async (t) => {
    const routes = fake.seen.map((r) => `${r.method} ${r.path}`).filter((r) => r !== 'HEAD /');
    t.same([...new Set(routes)], ['POST /v1/messages']);
    t.ok(
      fake.messages().every((r) => r.headers['x-api-key'] === KEY),
      'x-api-key on every call',
    );
  });
});

t.test('a model the adapter does not offer fails the start and names what it offers', async (t) => {
  const fake = await startFakeAnthropic({ apiKey: KEY, reply: () => ({ content: [{ type: 'text', text: 'no' }] }) });
  t.teardown(() => fake.close());
  const home = mkdtempSync(join(tmpdir(), 'svc-claude-home-'));
  t.teardown(() => rmSync(home, { recursive: true, force: true }));
  const outcome = await AcpRuntime.start({
    command: process.execPath,
    args: [CLAUDE_ACP],
    cwd: home,
    // Without ANTHROPIC_MODEL Claude Code lists only its aliases, not this model id.
    env: { ...claudeCodeEnv(fake.url), HOME: home, ANTHROPIC_API_KEY: KEY },
    model: MODEL,
    onUpdate() {},
    onStderr() {},
    onPermission: async () => ({ outcome: 'cancelled' }),
  })
    // A start that wrongly succeeds must not leave the agent running.
    .then(
      (runtime) => runtime.close().then(() => 'started'),
      (err: Error) => err.message,
    );
  t.match(outcome, /does not offer model claude-sonnet-4-5; it offers: default, /);
  t.equal(fake.messages().length, 0, 'no model was called');
});
