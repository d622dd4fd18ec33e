import t from 'tap';
import { backends, signUp, startTestService } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { teamSetUp } from './team-setup.ts';
import { until } from './until.ts';

// Each backend starts its services and runners again.

for (const backend of backends()) {
  t.test(`an idle teammate falls asleep, and a message wakes it on ${backend}`, async (t) => {
    const { http, token, agentOf, settled, presenceOf } = await teamSetUp(t, backend, {
      SANDBOX_IDLE_SUSPEND_MS: '1500',
    });
    const agent = await agentOf(token, 'sleepy');
    const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
    const asleep = await until(
      'asleep',
      async () => {
        const p = await presenceOf(agent.id);
        return p.state === 'asleep' ? p : undefined;
      },
      30_000,
    );
    t.same(asleep, { state: 'asleep', label: 'Asleep; a message wakes it' });
    t.equal((await http.get(`/api/sandboxes/${added.conversation.sandbox_id}`, { token })).body.status, 'suspended');

    const res = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'wake up' } });
    t.equal(res.status, 202, res.text);
    t.equal(res.body.conversation_id, added.conversation.id, 'the same conversation');
    const turn = await settled(added.conversation.id, 1);
    t.equal(turn.state, 'done');
    t.match(turn.reply, /^You said: wake up\./);
  });

  t.test(
    `a runner-backed teammate whose runner drops is machine_offline, and a message is 503 on ${backend}`,
    async (t) => {
      const svc = await startTestService(t, {
        backend: backend,
        env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '3000' },
      });
      const { http } = svc;
      const token = (await signUp(svc)).key;
      const { agent, runner, runnerRow } = await claudeOnRunner(t, svc, token);
      const added = await http.post('/api/team', { token, body: { agent_id: agent.id } });
      t.equal(added.status, 201, added.text);
      const mate = async () => (await http.get(`/api/team/${agent.id}`, { token })).body;
      await until('online', async () => (await mate()).presence.state === 'online', 30_000);
      t.equal((await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'hi' } })).status, 202);
      await until('the turn ends', async () => (await mate()).last_turn?.state === 'done', 30_000);

      runner.child.kill('SIGKILL');
      const offline = await until(
        'machine_offline',
        async () => {
          const m = await mate();
          return m.presence.state === 'machine_offline' ? m.presence : undefined;
        },
        30_000,
      );
      t.match(offline.label, /^Machine offline since \d\d:\d\d$/);
      const res = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'are you there' } });
      t.equal(res.status, 503);
      t.equal(res.body.error, 'runner_offline');
      t.equal((await mate()).last_turn.prompt, 'hi', 'nothing recorded');

      // Deleted, the runner is not coming back: the answer says so at once, not "retry".
      t.equal((await http.delete(`/api/runners/${runnerRow.id}`, { token })).status, 204);
      const gone = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'anyone?' } });
      t.equal(gone.status, 409, gone.text);
      t.equal(gone.body.error, 'no_runner_online');
      t.notOk(gone.headers.get('retry-after'), 'no Retry-After');
      t.equal((await mate()).last_turn.prompt, 'hi', 'nothing recorded');
      const events = (await http.get(`/api/conversations/${added.body.conversation.id}/events?limit=1000`, { token }))
        .body.data as { stage?: string; state?: string; data?: string }[];
      t.match(
        events.at(-1),
        { stage: 'reattach', state: 'failed', data: /runner was deleted.*next prompt builds it again/ },
        'its conversation says what happened and what comes next',
      );
    },
  );
}
