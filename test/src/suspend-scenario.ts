/**
 * The suspend scenario of suspend.test.ts (on Postgres and Redis) and suspend-embedded.test.ts,
 * one file per backend so each runs in parallel within its own time limit.
 */
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { type Backend, signUp, startTestService, type TestService } from './harness.ts';
import { alive, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { frames, parseFrame, rawGet, type WireEvent } from './sse-client.ts';
import { settlesWithin } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface TurnWire {
  id: string;
  number: number;
  state: string;
}

/**
 * A service whose `local` sandboxes are suspended after `idleMs`, an account with an Anthropic
 * credential, an environment whose setup script writes `kept.txt` into the sandbox, and an
 * agent on the default provider (`local`) with the scripted ACP agent as its runtime.
 */
export async function setUp(t: Test, backend: Backend, idleMs: string) {
  const svc = await startTestService(t, {
    backend,
    env: {
      SANDBOX_IDLE_SUSPEND_MS: idleMs,
      RUNNER_HEARTBEAT_MS: '500',
      RUNNER_GRACE_MS: '3000',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
    },
  });
  const { http } = svc;
  const me = await signUp(svc);
  const token = me.key;
  const env = (
    await http.post('/api/environments', {
      token,
      body: { name: 'main', setup_script: 'echo "built once" > kept.txt' },
    })
  ).body;
  const agentIn = async (name: string, mode: 'ephemeral' | 'persistent') =>
    (
      await http.post('/api/agents', {
        token,
        body: {
          name,
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: env.id,
          sandbox_mode: mode,
        },
      })
    ).body as { id: string };
  const credential = await http.put('/api/account/inference-credentials/anthropic_api_key', {
    token,
    body: { value: 'sk-ant-test-credential-123456' },
  });
  t.equal(credential.status, 200);

  const feed = async (id: string) =>
    (await http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as WireEvent[];
  const settled = async (id: string, number: number) => {
    let turns: TurnWire[] = [];
    for (let i = 0; i < 600; i++) {
      turns = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data as TurnWire[];
      const turn = turns.find((x) => x.number === number);
      if (turn && turn.state !== 'running') return turn;
      await sleep(50);
    }
    throw new Error(`turn ${number} still running: ${JSON.stringify(turns)}`);
  };
  const sandboxOf = async (conversationId: string) => {
    const conv = (await http.get(`/api/conversations/${conversationId}`, { token })).body;
    return (await http.get(`/api/sandboxes/${conv.sandbox_id}`, { token })).body as {
      id: string;
      status: string;
      conversations: { id: string; mid_turn: boolean }[];
    };
  };
  const statusBecomes = async (sandboxId: string, status: string, withinMs = 20_000) => {
    let seen = '';
    for (const end = Date.now() + withinMs; Date.now() < end; ) {
      seen = (await http.get(`/api/sandboxes/${sandboxId}`, { token })).body.status;
      if (seen === status) return;
      await sleep(100);
    }
    throw new Error(`sandbox ${sandboxId} is ${seen}, not ${status}`);
  };
  const dirOf = (sandboxId: string) => join(svc.dataDir, 'local-sandboxes', me.accountId, 'sandboxes', sandboxId);
  const pidOf = (sandboxId: string) => svc.local.held().find((h) => h.sandboxId === sandboxId)?.pid;
  return { svc, http, token, me, agentIn, feed, settled, sandboxOf, statusBecomes, dirOf, pidOf };
}

/** Watches a conversation over SSE from after `lastId` until its turn ends (the stream closes). */
async function watchTurn(svc: TestService, token: string, id: string, lastId: number) {
  const watch = rawGet(svc, `/api/conversations/${id}/stream?blocks=true&last_event_id=${lastId}`, {
    authorization: `Bearer ${token}`,
  });
  const ended = await settlesWithin(watch.closed, 40_000);
  if (!ended) watch.sock.destroy();
  return frames(watch.text())
    .map(parseFrame)
    .filter((e) => e.data !== undefined)
    .map((e) => JSON.parse(e.data as string) as WireEvent);
}

/**
 * The stages of a prompt that wakes a suspended sandbox: reattach (with the bridges out of its
 * network namespace and its broker opened again), then the turn in a fresh runtime session.
 */
const WOKEN_STAGES = [
  'reattach started',
  'network started',
  'network done',
  'broker started',
  'broker done',
  'reattach done',
  'turn started',
  'session started',
  'session done',
  'turn done',
];

export function suspendScenario(backend: Backend): void {
  t.test(`an idle local sandbox is suspended, keeps its disk, and a prompt wakes it (${backend})`, async (t) => {
    const s = await setUp(t, backend, '1500');
    const { http, token, feed, settled, sandboxOf, statusBecomes, dirOf, pidOf } = s;
    const agent = await s.agentIn('coder', 'ephemeral');

    const first = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'hello' } });
    t.equal(first.status, 201, JSON.stringify(first.body));
    const id = first.body.id as string;
    t.equal((await settled(id, 1)).state, 'done');
    const sandbox = await sandboxOf(id);
    const dir = dirOf(sandbox.id);
    t.ok(existsSync(join(dir, 'kept.txt')), 'the setup script wrote into the sandbox directory');
    const pid = pidOf(sandbox.id);
    t.ok(alive(pid), 'its runner-agent runs');

    t.test('a sandbox mid-turn is never suspended', async (t) => {
      const busy = await http.post('/api/conversations', {
        token,
        body: { agent_id: agent.id, prompt: 'be slow' },
      });
      t.equal(busy.status, 201);
      const busyId = busy.body.id as string;
      // The slow turn takes about 3 s, twice the idle time; the sandbox stays ready all along.
      const statuses = new Set<string>();
      for (;;) {
        const sbx = await sandboxOf(busyId);
        statuses.add(sbx.status);
        const turn = ((await http.get(`/api/conversations/${busyId}/turns`, { token })).body.data as TurnWire[])[0];
        if (turn && turn.state !== 'running') {
          t.equal(turn.state, 'done', 'the slow turn ran to its end');
          break;
        }
        await sleep(100);
      }
      t.notOk(statuses.has('suspended'), `never suspended mid-turn (${[...statuses].join(', ')})`);
      await http.post(`/api/conversations/${busyId}/terminate`, { token });
    });

    t.test('after the idle time it is suspended: runner-agent gone, disk kept, said in the log', async (t) => {
      await statusBecomes(sandbox.id, 'suspended');
      for (let i = 0; i < 100 && alive(pid); i++) await sleep(100);
      t.notOk(alive(pid), 'its runner-agent process is gone');
      t.equal(pidOf(sandbox.id), undefined, 'this node holds no runner-agent for it');
      t.equal(readFileSync(join(dir, 'kept.txt'), 'utf8'), 'built once\n', 'its directory is kept');
      const listed = (await http.get('/api/sandboxes?status=suspended', { token })).body.data as { id: string }[];
      t.ok(
        listed.some((x) => x.id === sandbox.id),
        'GET /api/sandboxes?status=suspended lists it',
      );
      let suspendEvent: WireEvent | undefined;
      for (let i = 0; i < 50 && !suspendEvent; i++) {
        suspendEvent = (await feed(id)).find((e) => e.stage === 'suspend');
        if (!suspendEvent) await sleep(100);
      }
      t.match(suspendEvent, { kind: 'stage', state: 'done', data: /"disk":"kept"/ }, 'stage suspend done');
      const audit = (await http.get('/api/audit?resource_type=sandbox', { token })).body.data as {
        action: string;
        resource_id: string;
      }[];
      t.ok(
        audit.some((a) => a.action === 'sandbox.suspended' && a.resource_id === sandbox.id),
        'an audit row',
      );
    });

    t.test('a prompt wakes it through reattach, then runs the turn on the kept disk', async (t) => {
      const before = await feed(id);
      const lastId = before.at(-1)?.id ?? 0;
      const res = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'welcome back' } });
      t.equal(res.status, 201, JSON.stringify(res.body));
      const events = await watchTurn(s.svc, token, id, lastId);
      const stages = events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
      t.same(
        stages,
        WOKEN_STAGES,
        'reattach started, then done, before the turn; no build stages; a fresh runtime session',
      );
      const reattach = events.find((e) => e.stage === 'reattach' && e.state === 'started');
      t.match(reattach?.data, /fresh/, 'the reattach says the runtime session is fresh');
      t.equal((await settled(id, 2)).state, 'done');
      t.equal((await sandboxOf(id)).status, 'ready', 'the sandbox is ready again');
      t.equal(readFileSync(join(dir, 'kept.txt'), 'utf8'), 'built once\n', 'the same disk, not built again');
      t.ok(alive(pidOf(sandbox.id)), 'a runner-agent runs for it again');
    });

    let attached = '';
    t.test('a launch attaching to a suspended sandbox by sandbox_id wakes it too', async (t) => {
      await statusBecomes(sandbox.id, 'suspended');
      const res = await http.post('/api/conversations', {
        token,
        body: { agent_id: agent.id, sandbox_id: sandbox.id, prompt: 'joining' },
      });
      t.equal(res.status, 201, JSON.stringify(res.body));
      attached = res.body.id as string;
      const events = await watchTurn(s.svc, token, attached, 0);
      const stages = events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
      t.same(stages, WOKEN_STAGES, 'woken, not built');
      t.equal((await settled(attached, 1)).state, 'done');
      t.equal((await sandboxOf(id)).status, 'ready');
      t.ok(existsSync(join(dir, 'kept.txt')), 'on the kept disk');
    });

    t.test('terminating the last conversation of a suspended sandbox destroys it and its disk', async (t) => {
      await statusBecomes(sandbox.id, 'suspended');
      if (attached) {
        const first = await http.post(`/api/conversations/${attached}/terminate`, { token });
        t.equal(first.status, 200);
        t.equal((await sandboxOf(id)).status, 'suspended', 'another conversation still has it');
        t.ok(existsSync(dir), 'and its disk');
      }
      const res = await http.post(`/api/conversations/${id}/terminate`, { token });
      t.equal(res.status, 200, JSON.stringify(res.body));
      t.equal((await sandboxOf(id)).status, 'terminated');
      t.notOk(existsSync(dir), 'its directory is removed');
    });

    t.test('a suspended persistent sandbox can be reset; the next prompt builds a clean machine', async (t) => {
      const keeper = await s.agentIn('keeper', 'persistent');
      const res = await http.post('/api/conversations', { token, body: { agent_id: keeper.id, prompt: 'hi' } });
      t.equal(res.status, 201);
      const cid = res.body.id as string;
      t.equal((await settled(cid, 1)).state, 'done');
      const sbx = await sandboxOf(cid);
      await statusBecomes(sbx.id, 'suspended');
      const reset = await http.delete(`/api/sandboxes/${sbx.id}`, { token });
      t.equal(reset.status, 204, JSON.stringify(reset.body));
      t.notOk(existsSync(dirOf(sbx.id)), 'its kept directory is removed');
      const lastId = (await feed(cid)).at(-1)?.id ?? 0;
      const next = await http.post(`/api/conversations/${cid}/prompts`, { token, body: { prompt: 'again' } });
      t.equal(next.status, 201);
      const events = await watchTurn(s.svc, token, cid, lastId);
      const stages = events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
      t.ok(stages.includes('sandbox done'), `built again, not woken (${stages.join(', ')})`);
      t.notOk(stages.includes('reattach started'));
      t.equal((await settled(cid, 2)).state, 'done');
      t.ok(existsSync(join(dirOf(sbx.id), 'kept.txt')), 'a clean machine, set up again');

      t.test('a wake that fails says why in stage reattach, and the turn fails visibly', async (t) => {
        await statusBecomes(sbx.id, 'suspended');
        rmSync(dirOf(sbx.id), { recursive: true, force: true });
        const lastId = (await feed(cid)).at(-1)?.id ?? 0;
        const res = await http.post(`/api/conversations/${cid}/prompts`, { token, body: { prompt: 'wake up' } });
        t.equal(res.status, 201);
        const events = await watchTurn(s.svc, token, cid, lastId);
        // The suspension's own stage event may land after the status moved: left out here.
        const stages = events
          .filter((e) => e.kind === 'stage' && e.stage !== 'suspend')
          .map((e) => `${e.stage} ${e.state}`);
        t.same(stages.slice(0, 2), ['reattach started', 'reattach failed'], stages.join(', '));
        t.match(
          events.find((e) => e.stage === 'reattach' && e.state === 'failed')?.data,
          /directory is gone/,
          'it says why',
        );
        t.equal((await settled(cid, 3)).state, 'failed', 'the turn failed');
        t.match(
          (await http.get(`/api/conversations/${cid}`, { token })).body,
          { status: 'idle' },
          'nothing left running',
        );
        await statusBecomes(sbx.id, 'failed', 5000);
      });
    });
  });
}
