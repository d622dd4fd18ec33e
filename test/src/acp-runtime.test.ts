import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Block, blocksOf } from '@svc/core';
import { AcpRuntime, type PermissionAnswer } from 'svc-runner';
import t, { type Test } from 'tap';
import { SCRIPTED_AGENT_ARGV } from './runner-process.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type Update = { sessionId: string; update: { sessionUpdate: string; content?: { type: string; text?: string } } };

/** A scripted agent under an AcpRuntime, with everything it reported collected. */
async function startAgent(t: Test, env: Record<string, string> = {}) {
  const cwd = mkdtempSync(join(tmpdir(), 'svc-acp-'));
  const seen = {
    updates: [] as Update[],
    stderr: [] as string[],
    permissions: [] as unknown[],
    answer: async (_request: unknown): Promise<PermissionAnswer> => ({ outcome: 'selected', optionId: 'allow' }),
  };
  const runtime = await AcpRuntime.start({
    command: SCRIPTED_AGENT_ARGV[0] as string,
    args: SCRIPTED_AGENT_ARGV.slice(1),
    cwd,
    env,
    onUpdate: (u) => seen.updates.push(u as Update),
    onStderr: (line) => seen.stderr.push(line),
    onPermission: (request) => {
      seen.permissions.push(request);
      return seen.answer(request);
    },
  });
  t.teardown(async () => {
    await runtime.close();
    rmSync(cwd, { recursive: true, force: true });
  });
  /** Runs one prompt; its updates are the ones that arrived while it ran. */
  async function turn(text: string, images?: { mimeType: string; data: string }[]) {
    const from = seen.updates.length;
    const result = await runtime.prompt(text, images);
    const updates = seen.updates.slice(from);
    return { ...result, updates, reply: replyOf(updates), blocks: updates.flatMap(blocksOfUpdate) };
  }
  return { runtime, seen, turn };
}

const replyOf = (updates: Update[]) =>
  updates
    .filter((u) => u.update.sessionUpdate === 'agent_message_chunk')
    .map((u) => u.update.content?.text ?? '')
    .join('');

/** The blocks of an update logged as the runner logs it: an `acp` output event, data = its JSON. */
const blocksOfUpdate = (params: unknown): Block[] =>
  blocksOf({ kind: 'output', stream: 'acp', data: JSON.stringify(params) });

/** Running, as opposed to gone or a zombie nobody reaped yet. */
function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0] !== 'Z';
  } catch {
    return false;
  }
}

const SECRET = 'sk-test-4f9a8b7c6d5e';
process.env.SVC_ACP_TEST_LEAK = 'must-not-leak-into-the-agent';

t.test('one session, many turns', async (t) => {
  const { runtime, seen, turn } = await startAgent(t, { SVC_ACP_SECRET: SECRET });
  t.match(runtime.sessionId, /^sess_/);

  t.test('a turn streams a thought, then the reply in short chunks that reassemble in order', async (t) => {
    const r = await turn('hello there');
    t.equal(r.stopReason, 'end_turn');
    t.equal(r.updates[0]?.update.sessionUpdate, 'agent_thought_chunk');
    t.equal(r.updates[0]?.update.content?.text, 'thinking about: hello there');
    const chunks = r.updates.slice(1);
    t.ok(chunks.length >= 4, `${chunks.length} message chunks`);
    t.ok(
      chunks.every((u) => u.update.sessionUpdate === 'agent_message_chunk'),
      'everything after the thought is the reply',
    );
    const sizes = chunks.map((u) => u.update.content?.text?.length ?? 0);
    t.ok(
      sizes.every((n) => n >= 3 && n <= 5),
      `chunks of 3-5 characters (${sizes.join(',')})`,
    );
    t.equal(r.reply, 'You said: hello there.');
    t.ok(
      r.updates.every((u) => u.sessionId === runtime.sessionId),
      'every update names the session',
    );
    t.same(r.usage, { input: 'hello there'.length, output: r.reply.length });
    t.same(
      r.blocks.map((b) => b.kind),
      ['thinking', ...chunks.map(() => 'text')],
    );
    t.equal(
      r.blocks
        .filter((b) => b.kind === 'text')
        .map((b) => (b as { body: string }).body)
        .join(''),
      r.reply,
      'the text blocks rebuild the reply',
    );
  });

  t.test('a tool call and its result arrive before the reply and parse as tool_use and tool_result', async (t) => {
    const r = await turn('use a tool');
    t.same(
      r.updates.slice(0, 3).map((u) => u.update.sessionUpdate),
      ['agent_thought_chunk', 'tool_call', 'tool_call_update'],
    );
    t.match(r.updates[1]?.update, { toolCallId: 'call_1', status: 'pending', kind: 'execute', title: 'run ls' });
    t.match(r.blocks[1], { kind: 'tool_use', id: 'call_1', name: 'run ls', summary: 'run ls' });
    t.match(r.blocks[2], { kind: 'tool_result', tool_id: 'call_1', body: 'README.md\npackage.json', error: false });
    t.equal(r.reply, 'You said: use a tool. The tool listed 2 files.');
  });

  t.test('a permission request goes to onPermission and its answer, allow or reject, to the agent', async (t) => {
    seen.answer = async () => ({ outcome: 'selected', optionId: 'allow' });
    const allowed = await turn('ask permission');
    t.match(allowed.reply, /permission: allow\.$/);
    seen.answer = async () => ({ outcome: 'selected', optionId: 'reject' });
    const rejected = await turn('ask permission again');
    t.match(rejected.reply, /permission: reject\.$/);
    t.equal(seen.permissions.length, 2);
    const [block] = blocksOf({ kind: 'output', stream: 'acp', data: JSON.stringify(seen.permissions[0]) });
    t.match(block, { kind: 'permission_request', request_id: 'call_2', summary: 'Allow write notes.md?' });
    t.same(
      (block as { options: { optionId: string; kind: string }[] }).options.map((o) => [o.optionId, o.kind]),
      [
        ['allow', 'allow_once'],
        ['reject', 'reject_once'],
      ],
    );
  });

  t.test('cancel answers a permission request still open as cancelled and ends the turn cancelled', async (t) => {
    let asked!: () => void;
    const wasAsked = new Promise<void>((resolve) => {
      asked = resolve;
    });
    seen.answer = () => {
      asked();
      return new Promise(() => {}); // nobody answers
    };
    const pending = turn('permission, then nobody answers');
    await wasAsked;
    await runtime.cancel();
    const r = await pending;
    t.equal(r.stopReason, 'cancelled');
  });

  t.test('cancel during a slow turn ends it with stopReason cancelled, and the session goes on', async (t) => {
    const started = Date.now();
    const from = seen.updates.length;
    const pending = runtime.prompt('slow please');
    while (seen.updates.length - from < 4) await sleep(20);
    await runtime.cancel();
    const r = await pending;
    t.equal(r.stopReason, 'cancelled');
    t.ok(Date.now() - started < 2500, `ended after ${Date.now() - started} ms, not the ~3 s of the whole turn`);
    const next = await turn('still there?');
    t.equal(next.stopReason, 'end_turn');
    t.equal(next.reply, 'You said: still there?.');
  });

  t.test('the agent sees exactly the environment it was given, not ours', async (t) => {
    t.match((await turn('print env SVC_ACP_SECRET')).reply, `SVC_ACP_SECRET=${SECRET}.`);
    t.match((await turn('print env SVC_ACP_TEST_LEAK')).reply, 'SVC_ACP_TEST_LEAK=(unset).');
    t.match((await turn('print env PATH')).reply, `PATH=${process.env.PATH}.`, 'PATH is filled in when absent');
    await turn('stderr print env SVC_ACP_SECRET');
    await turn('stderr');
    // stderr is its own pipe: a line may come after the response the agent wrote later.
    for (let i = 0; i < 50 && seen.stderr.length < 2; i++) await sleep(20);
    t.same(seen.stderr, [`stderr: SVC_ACP_SECRET=${SECRET}`, 'warning from agent'], 'stderr comes by lines');
  });

  t.test('images go with the prompt', async (t) => {
    const r = await turn('look', [{ mimeType: 'image/png', data: Buffer.from('not really a png').toString('base64') }]);
    t.equal(r.reply, 'You said: look. 1 image(s): image/png.');
  });

  t.test('a second prompt while one runs is refused', async (t) => {
    const first = runtime.prompt('slow');
    await t.rejects(runtime.prompt('me too'), /already running a prompt/);
    await runtime.cancel();
    t.equal((await first).stopReason, 'cancelled');
  });
});

t.test('an agent that exits mid-turn rejects the prompt with its exit code and last stderr lines', async (t) => {
  const { runtime } = await startAgent(t);
  await t.rejects(runtime.prompt('crash now'), /exited with code 3; its last stderr lines:\ncrashing on purpose/);
});

t.test('close() ends the whole process group', async (t) => {
  const { runtime, turn } = await startAgent(t);
  const r = await turn('start a grandchild');
  const grandchild = Number(/grandchild pid (\d+)/.exec(r.reply)?.[1]);
  t.ok(running(runtime.pid) && running(grandchild), `agent ${runtime.pid} and its grandchild ${grandchild} run`);
  await runtime.close();
  t.notOk(running(runtime.pid), 'the agent is gone');
  for (let i = 0; i < 50 && running(grandchild); i++) await sleep(20);
  t.notOk(running(grandchild), 'its grandchild is gone too');
  await runtime.close();
  t.pass('close() again is harmless');
});

t.test('a command that cannot start fails start() and says which', async (t) => {
  await t.rejects(
    AcpRuntime.start({
      command: '/nonexistent/acp-agent',
      args: [],
      cwd: tmpdir(),
      env: {},
      onUpdate() {},
      onStderr() {},
      onPermission: async () => ({ outcome: 'cancelled' }),
    }),
    /cannot start \/nonexistent\/acp-agent: .*ENOENT/,
  );
});
