// Autonomous turns end to end: a real svc-runner runs the scripted ACP agent, whose keyword
// `background` makes it say more 200 ms after answering its prompt. That output must land in
// a turn the server opened (origin `autonomous`, a marker prompt), on the stream and in the
// turn list with its reply, and the conversation must go back to idle and take prompts. One
// file per backend runs it (autonomous-turns.test.ts on Postgres and Redis,
// autonomous-turns-embedded.test.ts), so each runs in parallel within its own time limit.
import t, { type Test } from 'tap';
import { type Backend, signUp, startTestService, type TestService } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { blockText, frames, parseFrame, rawGet, type WireEvent } from './sse-client.ts';
import { until } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const MARKER = '(the agent kept working after its last answer)';
const BACKGROUND = 'Background work done.';

interface TurnWire {
  id: string;
  number: number;
  state: string;
  origin: string;
  prompt: string;
  reply: string | null;
  usage: unknown;
}

/** A service running the scripted agent on a real runner, an account and its agent. */
async function setUp(t: Test, backend: Backend, idleMs: string, env: Record<string, string> = {}) {
  const svc = await startTestService(t, {
    backend,
    env: {
      RUNNER_HEARTBEAT_MS: '500',
      RUNNER_GRACE_MS: '5000',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      AUTONOMOUS_IDLE_MS: idleMs,
      ...env,
    },
  });
  const { key: token } = await signUp(svc);
  const { agent, runner } = await claudeOnRunner(t, svc, token);
  return { svc, token, agent, runner };
}

function client(svc: TestService, token: string, runner: { output: string }) {
  const { http } = svc;
  const turnsOf = async (id: string) =>
    (await http.get(`/api/conversations/${id}/turns`, { token })).body.data as TurnWire[];
  const feed = async (id: string) =>
    (await http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as WireEvent[];
  /** Polls the turn list until `done` holds of it. */
  const turnsWhen = async (id: string, done: (turns: TurnWire[]) => boolean, what: string) => {
    let turns: TurnWire[] = [];
    for (let i = 0; i < 600; i++) {
      turns = await turnsOf(id);
      if (done(turns)) return turns;
      await sleep(50);
    }
    throw new Error(`${what} never happened: ${JSON.stringify(turns)}\n${runner.output}`);
  };
  /** Starts a conversation of `agentId` with `prompt`, checking it was created; its id. */
  const launch = async (t: Test, agentId: string, prompt: string) => {
    const res = await http.post('/api/conversations', { token, body: { agent_id: agentId, prompt } });
    t.equal(res.status, 201, JSON.stringify(res.body));
    return res.body.id as string;
  };
  return { http, turnsOf, feed, turnsWhen, launch };
}

/** The text the agent said under `turnId`, from events with blocks. */
const textOf = (events: WireEvent[], turnId: string) => blockText(events, 'text', turnId);

const streamEvents = (raw: string) =>
  frames(raw)
    .map(parseFrame)
    .filter((e) => e.data !== undefined)
    .map((e) => JSON.parse(e.data as string) as WireEvent);

/** The scenario on one backend: five services, each with a runner. */
export function autonomousTurnsScenario(backend: Backend): void {
  t.test(
    `output after the answer lands in an autonomous turn that ends when the runtime goes quiet on ${backend}`,
    async (t) => {
      const { svc, token, agent, runner } = await setUp(t, backend, '1000');
      const { http, turnsWhen, feed, launch } = client(svc, token, runner);
      const id = await launch(t, agent.id, 'work in the background');
      const watch = rawGet(svc, `/api/conversations/${id}/stream?wait=true&blocks=true&last_event_id=0`, {
        authorization: `Bearer ${token}`,
      });
      t.teardown(() => {
        watch.sock.destroy();
      });

      const turns = await turnsWhen(
        id,
        (ts) => ts.length === 2 && ts.every((x) => x.state !== 'running'),
        'an ended autonomous turn after the first',
      );
      const [user, autonomous] = [...turns].sort((a, b) => a.number - b.number) as [TurnWire, TurnWire];
      t.match(user, { number: 1, origin: 'user', state: 'done', reply: 'You said: work in the background.' });
      t.match(
        autonomous,
        { number: 2, origin: 'autonomous', prompt: MARKER, state: 'done', reply: BACKGROUND, usage: null },
        'the turn list shows the autonomous turn with its reply',
      );

      t.test('every word of the background output is on the stream, under the autonomous turn', async (t) => {
        let events: WireEvent[] = [];
        for (let i = 0; i < 200; i++) {
          events = streamEvents(watch.text());
          if (events.some((e) => e.turn_id === autonomous.id && e.stage === 'turn' && e.state === 'done')) break;
          await sleep(50);
        }
        t.equal(textOf(events, autonomous.id), BACKGROUND, 'the background words, whole, under the autonomous turn');
        t.equal(textOf(events, user.id), 'You said: work in the background.', 'none of them under the user turn');
        const turnStages = events
          .filter((e) => e.stage === 'turn')
          .map((e) => `${e.turn_id === autonomous.id ? 'autonomous' : 'user'} ${e.state}`);
        t.same(turnStages, ['user started', 'user done', 'autonomous started', 'autonomous done']);
        const texts = events.filter((e) => e.blocks?.some((b) => b.kind === 'text'));
        t.ok(
          texts.every((e) => e.turn_id === user.id || e.turn_id === autonomous.id),
          'no output outside a turn',
        );
      });

      t.test('the autonomous turn’s reply is found by search, under its own turn', async (t) => {
        const query = `/api/search?q=${encodeURIComponent('"Background work done"')}&kinds=reply&conversation_id=${id}`;
        const hits = await until(
          'the reply is searchable',
          async () => {
            const res = await http.get(query, { token });
            return res.body.data.length > 0 ? res.body.data : undefined;
          },
          15_000,
        );
        t.equal(hits.length, 1, 'one hit: the autonomous turn, not the user one');
        t.match(hits[0], {
          kind: 'reply',
          conversation_id: id,
          agent_id: agent.id,
          turn_id: autonomous.id,
          turn_number: 2,
        });
        t.match(hits[0].snippet, /Background work done/);
      });

      t.test('the conversation is idle again, counting both turns', async (t) => {
        const conv = await http.get(`/api/conversations/${id}`, { token });
        t.match(conv.body, { status: 'idle', turn_count: 2 });
      });

      t.test('a user prompt after it runs as the next turn', async (t) => {
        const next = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'and now?' } });
        t.equal(next.status, 201, JSON.stringify(next.body));
        const after = await turnsWhen(id, (ts) => ts.length === 3 && ts.every((x) => x.state !== 'running'), 'turn 3');
        t.match(
          after.find((x) => x.number === 3),
          { origin: 'user', state: 'done', reply: 'You said: and now?.' },
        );
        t.equal(textOf(await feed(id), autonomous.id), BACKGROUND, 'the autonomous turn kept what it had');
      });
    },
  );

  t.test(`an update about the session after the answer (usage, commands) opens no turn on ${backend}`, async (t) => {
    const { svc, token, agent, runner } = await setUp(t, backend, '1000');
    const { http, turnsWhen, feed, launch } = client(svc, token, runner);
    const id = await launch(t, agent.id, 'late usage');
    const kindOf = (e: WireEvent) =>
      e.stream === 'acp' ? (JSON.parse(e.data ?? '{}').update?.sessionUpdate as string | undefined) : undefined;
    const late = await until(
      'both late updates in the log',
      async () => {
        const events = (await feed(id)).filter(
          (e) => kindOf(e) === 'available_commands_update' || kindOf(e) === 'usage_update',
        );
        return events.length === 2 ? events : undefined;
      },
      30_000,
    );
    const turns = await turnsWhen(id, (ts) => ts.every((x) => x.state !== 'running'), 'the turns ended');
    t.equal(turns.length, 1, `no autonomous turn: ${JSON.stringify(turns)}`);
    t.match(turns[0], { number: 1, origin: 'user', state: 'done', reply: 'You said: late usage.' });
    t.same(
      late.map((e) => [kindOf(e), e.turn_id]),
      [
        ['usage_update', turns[0]?.id],
        ['available_commands_update', turns[0]?.id],
      ],
      'both are in the log under the turn they came after',
    );
    t.match((await http.get(`/api/conversations/${id}`, { token })).body, { status: 'idle', turn_count: 1 });
  });

  t.test(
    `a teammate's autonomous output reaches /api/team/stream, naming conversation and agent, on ${backend}`,
    async (t) => {
      const { svc, token, agent, runner } = await setUp(t, backend, '1000');
      const { http, turnsWhen } = client(svc, token, runner);
      const added = await http.post('/api/team', { token, body: { agent_id: agent.id } });
      t.equal(added.status, 201, added.text);
      const id = added.body.conversation.id as string;
      await until(
        'the teammate is online',
        async () => (await http.get(`/api/team/${agent.id}`, { token })).body.presence.state === 'online',
        30_000,
      );
      const watch = rawGet(svc, '/api/team/stream?blocks=true', { authorization: `Bearer ${token}` });
      t.teardown(() => watch.sock.destroy());
      await until('the team stream is open', () => frames(watch.text()).length > 0);
      const sent = await http.post(`/api/team/${agent.id}/messages`, {
        token,
        body: { prompt: 'work in the background' },
      });
      t.equal(sent.status, 202, sent.text);
      t.equal(sent.body.conversation_id, id);
      const turns = await turnsWhen(
        id,
        (ts) => ts.length === 2 && ts.every((x) => x.state !== 'running'),
        'an ended autonomous turn after the message',
      );
      const autonomous = turns.find((x) => x.origin === 'autonomous') as TurnWire;
      t.match(autonomous, { number: 2, prompt: MARKER, state: 'done', reply: BACKGROUND });
      const ofAutonomous = await until('the autonomous turn’s end on the team stream', () => {
        const events = streamEvents(watch.text()).filter((e) => e.turn_id === autonomous.id);
        return events.some((e) => e.stage === 'turn' && e.state === 'done') ? events : undefined;
      });
      t.equal(textOf(ofAutonomous, autonomous.id), BACKGROUND, 'the background words, whole');
      t.ok(
        ofAutonomous.every((e) => {
          const named = e as WireEvent & { conversation_id?: string; agent_id?: string };
          return named.conversation_id === id && named.agent_id === agent.id;
        }),
        'every event of the autonomous turn names the team conversation and the agent',
      );
      t.same(
        ofAutonomous.filter((e) => e.stage === 'turn').map((e) => e.state),
        ['started', 'done'],
        'its start and end',
      );
    },
  );

  t.test(`a user prompt ends a running autonomous turn first, then runs on ${backend}`, async (t) => {
    // An idle time far beyond the test: only the prompt can end the autonomous turn.
    const { svc, token, agent, runner } = await setUp(t, backend, '600000');
    const { http, turnsWhen, feed, launch } = client(svc, token, runner);
    const id = await launch(t, agent.id, 'background please');
    const running = await turnsWhen(
      id,
      (ts) => ts.some((x) => x.origin === 'autonomous' && x.state === 'running'),
      'a running autonomous turn',
    );
    const autonomous = running.find((x) => x.origin === 'autonomous') as TurnWire;
    t.match(autonomous, { number: 2, prompt: MARKER, reply: null });
    const conv = await http.get(`/api/conversations/${id}`, { token });
    t.equal(conv.body.status, 'running', 'the conversation runs while its agent works on');
    for (let i = 0; i < 200 && textOf(await feed(id), autonomous.id) !== BACKGROUND; i++) await sleep(50);

    const next = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'stop and answer' } });
    t.equal(next.status, 201, `the prompt is taken: ${JSON.stringify(next.body)}`);
    const turns = await turnsWhen(id, (ts) => ts.length === 3 && ts.every((x) => x.state !== 'running'), 'turn 3');
    t.match(
      turns.find((x) => x.number === 2),
      { origin: 'autonomous', state: 'done', reply: BACKGROUND },
    );
    t.match(
      turns.find((x) => x.number === 3),
      { origin: 'user', state: 'done', reply: 'You said: stop and answer.' },
    );

    const events = await feed(id);
    const order = events
      .filter((e) => e.stage === 'turn')
      .map((e) => `${turns.find((x) => x.id === e.turn_id)?.number} ${e.state}`);
    t.same(order, ['1 started', '1 done', '2 started', '2 done', '3 started', '3 done'], 'the turns follow each other');
    const idle = await http.get(`/api/conversations/${id}`, { token });
    t.equal(idle.body.status, 'idle');

    t.test('an interrupt ends a running autonomous turn `interrupted`, keeping what it said', async (t) => {
      const again = await http.post(`/api/conversations/${id}/prompts`, {
        token,
        body: { prompt: 'background again' },
      });
      t.equal(again.status, 201, JSON.stringify(again.body));
      const open = await turnsWhen(
        id,
        (ts) => ts.some((x) => x.number === 5 && x.origin === 'autonomous' && x.state === 'running'),
        'a second autonomous turn',
      );
      const fifth = open.find((x) => x.number === 5) as TurnWire;
      for (let i = 0; i < 200 && textOf(await feed(id), fifth.id) !== BACKGROUND; i++) await sleep(50);
      const stopped = await http.post(`/api/conversations/${id}/interrupt`, { token });
      t.equal(stopped.status, 200, JSON.stringify(stopped.body));
      const ended = await turnsWhen(id, (ts) => ts.every((x) => x.state !== 'running'), 'the interrupted turn ended');
      t.match(
        ended.find((x) => x.number === 5),
        { origin: 'autonomous', state: 'interrupted', reply: BACKGROUND },
      );
      t.equal((await http.get(`/api/conversations/${id}`, { token })).body.status, 'idle');
    });
  });

  t.test(
    `an autonomous turn that never goes quiet ends \`timeout\` at the turn time limit on ${backend}`,
    async (t) => {
      // The agent talks every 200 ms for a minute; only the time limit (3 s) ends its turn.
      const { svc, token, agent, runner } = await setUp(t, backend, '600000', { TURN_TIME_LIMIT_MS: '3000' });
      const { turnsWhen, feed, launch } = client(svc, token, runner);
      const id = await launch(t, agent.id, 'keep talking');
      const turns = await turnsWhen(
        id,
        (ts) => ts.some((x) => x.origin === 'autonomous' && x.state !== 'running'),
        'the autonomous turn ended',
      );
      const autonomous = turns.find((x) => x.origin === 'autonomous') as TurnWire;
      t.match(autonomous, { number: 2, state: 'timeout', usage: null });
      t.match(autonomous.reply, /^tick 0\. tick 1\. /, 'what it said until then is its reply');
      t.match(textOf(await feed(id), autonomous.id), /^tick 0\. tick 1\. /, 'and in the log under it');
      t.equal(turns.find((x) => x.number === 1)?.state, 'done', 'the user turn itself was within the limit');
    },
  );
}
