/** Idle local sandboxes suspended and woken, on the embedded backend (suspend-scenario.ts). */
import t from 'tap';
import { alive } from './runner-process.ts';
import { setUp, suspendScenario } from './suspend-scenario.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

suspendScenario('embedded');

t.test('with SANDBOX_IDLE_SUSPEND_MS=0 an idle local sandbox is never suspended', async (t) => {
  const s = await setUp(t, 'embedded', '0');
  const agent = await s.agentIn('coder', 'ephemeral');
  const res = await s.http.post('/api/conversations', { token: s.token, body: { agent_id: agent.id, prompt: 'hi' } });
  t.equal(res.status, 201);
  t.equal((await s.settled(res.body.id, 1)).state, 'done');
  const sandbox = await s.sandboxOf(res.body.id);
  const pid = s.pidOf(sandbox.id);
  await sleep(3000);
  t.equal((await s.sandboxOf(res.body.id)).status, 'ready');
  t.ok(alive(pid), 'its runner-agent still runs');
});
