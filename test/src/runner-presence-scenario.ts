/**
 * The runner presence scenario of runner-presence.test.ts (on Postgres and Redis) and
 * runner-presence-embedded.test.ts, one file per backend so each runs in parallel within its
 * own time limit.
 */
import { once } from 'node:events';
import t from 'tap';
import { RunnerPresenceWorker } from '../../gateway/src/workers/runner-presence.ts';
import { type Backend, signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';
import { eventually } from './until.ts';

/** How long a runner may stay silent before it counts as gone (short, for the test). */
const GRACE_MS = 1500;
/** Long enough for several grace periods on a busy machine: waits end early when the check holds. */
const PATIENCE_MS = 30_000;

export function runnerPresenceScenario(backend: Backend): void {
  t.test(`a self-hosted runner connecting and dropping, on /api/team/stream (${backend})`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: {
        RUNNER_HEARTBEAT_MS: '200',
        RUNNER_GRACE_MS: String(GRACE_MS),
        LOG_COPY_INTERVAL_MS: '50',
        SSE_IDLE_CLOSE_MS: '0',
        SCHEDULER_INTERVAL_MS: '0',
        RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const token = me.key;
    const { agent } = await claudeAgent(t, http, token);

    const stream = rawGet(svc, '/api/team/stream', { authorization: `Bearer ${token}` });
    t.teardown(() => stream.sock.destroy());
    const events = (kind: string) =>
      frames(stream.text())
        .map(parseFrame)
        .filter((e) => e.event === kind);
    t.ok(await eventually(() => frames(stream.text()).some((f) => parseFrame(f).id !== undefined), 10_000));
    const teamEvents = () => events('team').length;

    /**
     * The number of `team` events once every one written so far has arrived: a schedule change
     * is written after them, and one tenant's events reach the stream in the order written.
     */
    const settled = async () => {
      const before = events('schedule').length;
      const base = `/api/team/${agent.id}/schedules`;
      const marker = (await http.post(base, { token, body: { cron: '@daily', prompt: 'marker' } })).body;
      await http.delete(`${base}/${marker.id}`, { token });
      t.ok(await eventually(() => events('schedule').length >= before + 2, PATIENCE_MS), 'the marker arrived');
      return teamEvents();
    };
    const newRunner = async (name: string) =>
      (await http.post('/api/runners', { token, body: { name } })).body as { id: string; token: string };
    const online = async (id: string) =>
      ((await http.get('/api/runners', { token })).body.data as { id: string; online: boolean }[]).find(
        (r) => r.id === id,
      )?.online;
    const rowOf = async (id: string) =>
      (
        await svc.db.sql<{ connected: boolean; epoch: number }[]>`SELECT connected, epoch FROM runners WHERE id = ${id}`
      )[0];
    // Another node's presence sweep, run by hand.
    const otherNode = new RunnerPresenceWorker({ sql: svc.db.sql, logger: svc.log }, { timeoutMs: GRACE_MS });

    t.test('connecting, then stopping cleanly, each tell the owner once', async (t) => {
      const base = await settled();
      const r = await newRunner('laptop');
      const runner = await startRunnerProcess(t, svc.url, r.token);
      t.ok(await eventually(() => teamEvents() === base + 1, PATIENCE_MS), 'told of the connection');
      t.same(JSON.parse(events('team').at(-1)?.data as string), { reason: 'changed' });
      t.equal(await settled(), base + 1, 'once');
      t.equal(await online(r.id), true);

      runner.child.kill('SIGTERM');
      await once(runner.child, 'exit');
      t.ok(await eventually(() => teamEvents() === base + 2, PATIENCE_MS), 'told of the stop');
      t.equal(await otherNode.pass(), 0, 'nothing is left for a sweep');
      t.equal(await settled(), base + 2, 'once');
      t.equal(await online(r.id), false);
    });

    t.test('a runner killed with SIGKILL: one event', async (t) => {
      const r = await newRunner('killed');
      const runner = await startRunnerProcess(t, svc.url, r.token);
      t.ok(await eventually(async () => (await rowOf(r.id))?.connected === true, PATIENCE_MS));
      const base = await settled();
      runner.child.kill('SIGKILL');
      t.ok(await eventually(() => teamEvents() === base + 1, PATIENCE_MS), 'told of the drop');
      t.ok(await eventually(() => !svc.fabric.isLive(r.id), PATIENCE_MS));
      t.equal((await rowOf(r.id))?.connected, false);
      t.equal(await otherNode.pass(), 0, 'nothing is left for a sweep');
      t.equal(await settled(), base + 1, 'once');
    });

    t.test('a runner stopped with SIGSTOP (silent): one event after the timeout, whichever node notices', async (t) => {
      const r = await newRunner('frozen');
      const runner = await startRunnerProcess(t, svc.url, r.token);
      t.ok(await eventually(async () => (await rowOf(r.id))?.connected === true, PATIENCE_MS));
      const base = await settled();
      runner.child.kill('SIGSTOP');
      t.teardown(() => {
        runner.child.kill('SIGCONT');
      });
      // The node holding the connection and another node's sweep both look for the silence.
      t.ok(
        await eventually(async () => {
          await otherNode.pass();
          return teamEvents() === base + 1;
        }, PATIENCE_MS),
        'told of the drop',
      );
      t.ok(await eventually(() => !svc.fabric.isLive(r.id), PATIENCE_MS), 'the connection was closed');
      t.equal((await rowOf(r.id))?.connected, false);
      t.same(await Promise.all([otherNode.pass(), otherNode.pass()]), [0, 0]);
      t.equal(await settled(), base + 1, 'once');
      t.equal(await online(r.id), false);

      runner.child.kill('SIGCONT');
      t.ok(await eventually(() => /reconnected as runner/.test(runner.output), PATIENCE_MS), runner.output);
      t.ok(await eventually(() => teamEvents() === base + 2, PATIENCE_MS), 'told of its return');
      runner.child.kill('SIGKILL');
      await once(runner.child, 'exit');
    });

    t.test('a connection whose node died with it is recorded gone by a sweep, once', async (t) => {
      const r = await newRunner('orphan');
      // What a node records at a hello, before it dies without a close reaching anyone.
      await svc.db.sql`UPDATE runners SET connected = true, epoch = epoch + 1, last_seen_at = now() WHERE id = ${r.id}`;
      const base = await settled();
      const sweeps = [
        otherNode,
        new RunnerPresenceWorker({ sql: svc.db.sql, logger: svc.log }, { timeoutMs: GRACE_MS }),
      ];
      t.ok(
        await eventually(async () => {
          await Promise.all(sweeps.map((w) => w.pass()));
          return (await rowOf(r.id))?.connected === false;
        }, PATIENCE_MS),
        'recorded disconnected after the timeout',
      );
      t.equal(await settled(), base + 1, 'one event, however many nodes swept');
      t.equal(await online(r.id), false);
    });

    t.test('a connection recorded gone while its node still holds it is closed and comes back', async (t) => {
      const r = await newRunner('stalled');
      const runner = await startRunnerProcess(t, svc.url, r.token);
      t.ok(await eventually(async () => (await rowOf(r.id))?.connected === true, PATIENCE_MS));
      const { epoch } = (await rowOf(r.id)) as { epoch: number };
      // What another node's sweep records when this node's heartbeats stalled for a grace period.
      await svc.db.sql`UPDATE runners SET connected = false WHERE id = ${r.id} AND epoch = ${epoch}`;
      t.ok(
        await eventually(() => runner.output.includes(`(connection ${epoch + 1})`), PATIENCE_MS),
        `it reconnected: ${runner.output}`,
      );
      t.ok(await eventually(async () => (await online(r.id)) === true, PATIENCE_MS), 'and is online again');
      t.equal((await rowOf(r.id))?.epoch, epoch + 1);
    });

    t.test('a connected runner deleted by its owner drops: one event', async (t) => {
      const r = await newRunner('retired');
      const runner = await startRunnerProcess(t, svc.url, r.token);
      t.ok(await eventually(async () => (await rowOf(r.id))?.connected === true, PATIENCE_MS));
      const base = await settled();
      t.equal((await http.delete(`/api/runners/${r.id}`, { token })).status, 204);
      await once(runner.child, 'exit');
      t.ok(await eventually(() => teamEvents() === base + 1, PATIENCE_MS), 'told of the drop');
      t.equal(await settled(), base + 1, 'once');

      const idle = await newRunner('never connected');
      t.equal((await http.delete(`/api/runners/${idle.id}`, { token })).status, 204);
      t.equal(await settled(), base + 1, 'a runner that was not connected drops nothing');
    });

    t.test('runners the instance starts for local sandboxes tell nothing', async (t) => {
      const base = await settled();
      const started = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'hello' } });
      t.equal(started.status, 201, started.text);
      const id = started.body.id as string;
      t.ok(
        await eventually(async () => {
          const turns = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data;
          return turns[0]?.state === 'done';
        }, PATIENCE_MS),
        'the turn ran on a local runner',
      );
      const [local] = await svc.db.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM runners WHERE kind = 'local'`;
      t.ok((local?.n ?? 0) > 0, 'a local runner connected');
      t.equal(await settled(), base, 'no team event');
    });
  });
}
