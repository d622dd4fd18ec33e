import t from 'tap';
import { signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('a gemini runtime gets its model, its credential and the service, the way it reads them', async (t) => {
  const svc = await startTestService(t, { env: { RUNTIME_GEMINI_COMMAND: SCRIPTED_AGENT_COMMAND } });
  const { http } = svc;
  const me = await signUp(svc);
  const token = me.key;
  const env = (await http.post('/api/environments', { token, body: { name: 'main' } })).body;
  const agent = (
    await http.post('/api/agents', {
      token,
      body: {
        name: 'gem',
        runtime: 'gemini',
        model: 'google/gemini-2.5-pro',
        environment_id: env.id,
        sandbox_provider: 'runner',
      },
    })
  ).body;
  t.ok(agent.id, JSON.stringify(agent));
  const missing = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'hi' } });
  t.match(missing, { status: 422, body: { error: 'missing_credential', details: { provider: ['gemini_api_key'] } } });
  await http.put('/api/account/inference-credentials/gemini_api_key', {
    token,
    body: { value: 'AIza-test-credential-123456' },
  });
  const runner = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  await startRunnerProcess(t, svc.url, runner.token);

  const res = await http.post('/api/conversations', {
    token,
    body: {
      agent_id: agent.id,
      prompt: 'print env GEMINI_MODEL and print env GEMINI_API_KEY and print env SVC_API_URL',
    },
  });
  t.equal(res.status, 201, JSON.stringify(res.body));
  let text = '';
  for (let i = 0; i < 300; i++) {
    const events = (await http.get(`/api/conversations/${res.body.id}/events?limit=1000&blocks=true`, { token })).body
      .data as { stage: string | null; state: string | null; blocks: { kind: string; body?: string }[] }[];
    if (events.some((e) => e.stage === 'turn' && e.state === 'done')) {
      text = events
        .flatMap((e) => e.blocks)
        .filter((b) => b.kind === 'text')
        .map((b) => b.body)
        .join('');
      break;
    }
    await sleep(50);
  }
  t.match(text, /GEMINI_MODEL=gemini-2\.5-pro\./, 'the model, as Gemini CLI names it');
  // The turn's record ended before its end event reached the log: the next prompt goes at once.
  const key = await http.post(`/api/conversations/${res.body.id}/prompts`, {
    token,
    body: { prompt: 'print env GEMINI_API_KEY' },
  });
  t.equal(key.status, 201);
  let said = '';
  for (let i = 0; i < 300 && !said.includes('GEMINI_API_KEY='); i++) {
    const events = (await http.get(`/api/conversations/${res.body.id}/events?limit=1000&blocks=true`, { token })).body
      .data as { turn_id: string | null; blocks: { kind: string; body?: string }[] }[];
    said = events
      .filter((e) => e.turn_id === key.body.id)
      .flatMap((e) => e.blocks)
      .filter((b) => b.kind === 'text')
      .map((b) => b.body)
      .join('');
    await sleep(50);
  }
  t.match(said, /GEMINI_API_KEY=\[REDACTED\]/, 'the credential reached it, and never the log');
});
