import { existsSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { signUp, twoNodes } from './harness.ts';
import { claudeAgent, claudeOnRunner, SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/**
 * How soon a closing must show when heartbeats are a minute apart: a third of that, so a
 * close seen within it came from the deletion, with room for a loaded machine (CI runs three
 * files at once on two cores).
 */
const PROMPTLY_MS = 20_000;

/** Whether `ok` holds within `ms`, checked every 50 ms. */
async function within(ms: number, ok: () => boolean | Promise<boolean>): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await ok()) return true;
    if (Date.now() > deadline) return false;
    await sleep(50);
  }
}

t.test(
  'two nodes: a runner held by node A takes commands sent through node B',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres shared by two nodes' },
  async (t) => {
    const timing = {
      RUNNER_HEARTBEAT_MS: '300',
      RUNNER_GRACE_MS: '3000',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
    };
    const { a, b } = await twoNodes(t, timing);
    const me = await signUp(a);
    const token = me.key;
    const { agent } = await claudeAgent(t, b.http, token, 'runner');
    const runnerRow = (await a.http.post('/api/runners', { token, body: { name: 'box' } })).body;
    await startRunnerProcess(t, a.url, runnerRow.token);
    t.ok(a.fabric.isLive(runnerRow.id) && !b.fabric.isLive(runnerRow.id), 'node A holds the runner');

    const turns = async (id: string) =>
      (await b.http.get(`/api/conversations/${id}/turns`, { token })).body.data as { state: string }[];
    const settled = async (id: string, n: number) => {
      for (let i = 0; i < 300; i++) {
        const turn = (await turns(id))[n - 1];
        if (turn && turn.state !== 'running') return turn;
        await sleep(50);
      }
      throw new Error('still running');
    };

    const res = await b.http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'hello via B' } });
    t.equal(res.status, 201, JSON.stringify(res.body));
    const id = res.body.id as string;
    t.equal((await settled(id, 1)).state, 'done', 'built and run through node B');
    const text = (
      (await b.http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as {
        blocks: { kind: string; body?: string }[];
      }[]
    )
      .flatMap((e) => e.blocks)
      .filter((x) => x.kind === 'text')
      .map((x) => x.body)
      .join('');
    t.match(text, /^You said: hello via B\./);

    const slow = await b.http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'be slow' } });
    t.equal(slow.status, 201);
    await sleep(800);
    const stop = await b.http.post(`/api/conversations/${id}/interrupt`, { token });
    t.equal(stop.status, 200);
    t.equal((await settled(id, 2)).state, 'interrupted', 'the interrupt reached the runner through node A');
    const events = (await b.http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as {
      stage: string | null;
      state: string | null;
      data: string | null;
    }[];
    const end = events.filter((e) => e.stage === 'turn' && e.state === 'interrupted');
    t.equal(end.length, 1);
    t.notMatch(end[0]?.data ?? '', /not connected/, 'ended by the runtime, not by the service');

    const bye = await b.http.post(`/api/conversations/${id}/terminate`, { token });
    t.equal(bye.status, 200);
    t.equal(bye.body.status, 'terminated');
  },
);

t.test(
  "two nodes: deleting an account through node A closes its runner's connection on node B at once",
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres shared by two nodes' },
  async (t) => {
    // Heartbeats a minute apart: a connection closed within seconds was closed by the
    // deletion, not by a heartbeat that found its runner gone.
    const { a, b } = await twoNodes(t, {
      RUNNER_HEARTBEAT_MS: '60000',
      RUNNER_GRACE_MS: '120000',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
    });
    const me = await signUp(a);
    const token = me.key;
    const { agent, runnerRow, runner } = await claudeOnRunner(t, b, token);
    t.ok(b.fabric.isLive(runnerRow.id) && !a.fabric.isLive(runnerRow.id), 'node B holds the runner');

    const conv = await a.http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'hello' } });
    t.equal(conv.status, 201, JSON.stringify(conv.body));
    t.ok(
      await within(30_000, async () => {
        const turns = (await a.http.get(`/api/conversations/${conv.body.id}/turns`, { token })).body.data;
        return turns[0]?.state === 'done';
      }),
      'a turn ran on the runner through node A',
    );
    const sandboxId = (await a.http.get(`/api/conversations/${conv.body.id}`, { token })).body.sandbox_id as string;
    const sandboxDir = join(runner.root, 'sandboxes', sandboxId);
    t.ok(existsSync(sandboxDir), 'the sandbox is on the runner’s disk');

    const res = await a.http.delete('/api/account', { token, body: { confirm: me.email } });
    t.equal(res.status, 204);
    t.ok(
      await within(PROMPTLY_MS, () => !b.fabric.isLive(runnerRow.id)),
      'node B closed the connection long before the next heartbeat',
    );
    t.ok(await within(PROMPTLY_MS, () => runner.child.exitCode !== null), 'the runner-agent was told');
    t.equal(runner.child.exitCode, 6, 'it stopped as revoked');
    t.match(runner.output, /the account was deleted/, 'with the reason the deleting node gave');
    t.notOk(existsSync(sandboxDir), 'its sandbox directory is removed');
  },
);

t.test(
  'two nodes: deleting a runner through node A closes its connection on node B at once',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres shared by two nodes' },
  async (t) => {
    // Heartbeats a minute apart: a connection closed within seconds was closed by the
    // deletion, not by a heartbeat that found its runner gone.
    const { a, b } = await twoNodes(t, { RUNNER_HEARTBEAT_MS: '60000', RUNNER_GRACE_MS: '120000' });
    const me = await signUp(a);
    const { runnerRow, runner } = await claudeOnRunner(t, b, me.key);
    t.ok(await within(10_000, () => b.fabric.isLive(runnerRow.id)), 'node B holds the runner');
    t.notOk(a.fabric.isLive(runnerRow.id), 'node A does not');

    const res = await a.http.delete(`/api/runners/${runnerRow.id}`, { token: me.key });
    t.equal(res.status, 204);
    t.ok(
      await within(PROMPTLY_MS, () => !b.fabric.isLive(runnerRow.id)),
      'node B closed the connection long before the next heartbeat',
    );
    t.ok(await within(PROMPTLY_MS, () => runner.child.exitCode !== null), 'the runner-agent was told');
    t.equal(runner.child.exitCode, 6, 'it stopped as deleted');
    t.match(runner.output, /this runner was deleted by its owner/, 'with the reason the deleting node gave');
  },
);
