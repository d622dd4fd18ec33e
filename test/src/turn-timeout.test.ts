import t from 'tap';
import { signUp, startTestService } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('a turn past TURN_TIME_LIMIT_MS ends timeout; the conversation takes the next prompt', async (t) => {
  const svc = await startTestService(t, {
    env: { TURN_TIME_LIMIT_MS: '1500', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
  });
  const { http } = svc;
  const me = await signUp(svc);
  const token = me.key;
  const { agent } = await claudeOnRunner(t, svc, token);

  const settled = async (id: string, n: number) => {
    for (let i = 0; i < 300; i++) {
      const turn = ((await http.get(`/api/conversations/${id}/turns`, { token })).body.data as { state: string }[])[
        n - 1
      ];
      if (turn && turn.state !== 'running') return turn;
      await sleep(50);
    }
    throw new Error('still running');
  };
  const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'be slow' } });
  t.equal(res.status, 201);
  const id = res.body.id as string;
  t.equal((await settled(id, 1)).state, 'timeout');
  const events = (await http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as {
    stage: string | null;
    state: string | null;
    data: string | null;
  }[];
  const end = events.find((e) => e.stage === 'turn' && e.state === 'timeout');
  t.match(JSON.parse(end?.data ?? '{}'), { stop_reason: 'cancelled' }, 'the runtime was cancelled at the limit');
  t.equal((await http.get(`/api/conversations/${id}`, { token })).body.status, 'idle');
  const next = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'quick one' } });
  t.equal(next.status, 201);
  t.equal((await settled(id, 2)).state, 'done', 'the same runtime takes the next turn');
});
