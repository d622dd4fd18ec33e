import t, { type Test } from 'tap';
import { backends, signUp, startTestService, type TestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { eventually } from './until.ts';

/** A grace much shorter than a local runner-agent's connect timeout (30 s). */
const GRACE_MS = 1000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The local runner-agent the service spawns next, stopped (SIGSTOP) before it can connect: the
 * service runs in this process, so the poll sees the child in the same turn of the event loop
 * that spawned it, long before a Node process has started.
 */
async function stopNextRunnerAgent(svc: TestService, before: Set<number | undefined>) {
  for (;;) {
    const held = svc.local.held().find((h) => !before.has(h.pid));
    if (held?.pid) {
      process.kill(held.pid, 'SIGSTOP');
      return held;
    }
    await new Promise((r) => setImmediate(r));
  }
}

for (const backend of backends()) {
  t.test(`a turn whose local machine is still starting is not adrift (${backend})`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: {
        RUNNER_HEARTBEAT_MS: '200',
        RUNNER_GRACE_MS: String(GRACE_MS),
        SCHEDULER_INTERVAL_MS: '0',
        RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const token = me.key;
    const { agent } = await claudeAgent(t, http, token);
    const turnOf = async (id: string) =>
      (await http.get(`/api/conversations/${id}/turns`, { token })).body.data[0] as { id: string; state: string };
    const stagesOf = async (id: string) =>
      (
        (await http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as {
          stage: string | null;
          state: string | null;
        }[]
      )
        .filter((e) => e.stage)
        .map((e) => `${e.stage} ${e.state}`);

    /** A conversation launched on a new local sandbox whose runner-agent is stopped before it connects. */
    const launchStopped = async (t: Test) => {
      const before = new Set(svc.local.held().map((h) => h.pid));
      const started = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'hello' } });
      t.equal(started.status, 201, started.text);
      return { id: started.body.id as string, held: await stopNextRunnerAgent(svc, before) };
    };

    t.test('a runner-agent slow to connect (three graces) runs its turn', async (t) => {
      const { id, held } = await launchStopped(t);
      t.teardown(() => {
        process.kill(held.pid as number, 'SIGCONT');
      });
      t.notOk(svc.fabric.isLive(held.runnerId), 'stopped before it connected');
      // The adrift sweep runs every half grace: a turn opened two graces ago with no runner was ended before.
      await sleep(3 * GRACE_MS);
      t.equal((await turnOf(id)).state, 'running', 'still running while its machine starts');
      process.kill(held.pid as number, 'SIGCONT');
      t.ok(await eventually(async () => (await turnOf(id)).state !== 'running', 30_000), 'the turn ended');
      t.equal((await turnOf(id)).state, 'done', (await stagesOf(id)).join(', '));
      t.notOk((await stagesOf(id)).includes('reattach failed'), 'nothing was said adrift');
    });

    t.test('a start that outlasted its timeout is ended by the sweep', async (t) => {
      const { id, held } = await launchStopped(t);
      // Its start gives up at once when the child is gone.
      t.teardown(() => {
        process.kill(held.pid as number, 'SIGKILL');
      });
      // What a start left behind by a service that stopped in its middle looks like once the
      // provider's timeout (30 s) and a grace have passed: nothing else would end this turn.
      const turn = await turnOf(id);
      await svc.db.sql`UPDATE turns SET created_at = now() - interval '40 seconds' WHERE id = ${turn.id}`;
      t.ok(await eventually(async () => (await turnOf(id)).state !== 'running', 30_000), 'the turn ended');
      t.equal((await turnOf(id)).state, 'interrupted');
      // The log's copy may follow the turn's row by a moment.
      t.ok(
        await eventually(async () => (await stagesOf(id)).includes('reattach failed'), 10_000),
        `said adrift: ${(await stagesOf(id)).join(', ')}`,
      );
    });
  });
}
