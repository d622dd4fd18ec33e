// What a user watches on /api/team/stream, in order: a teammate added, renamed, a message
// and its reply streaming to the turn's end, a rotation to a fresh conversation, and its
// self-hosted runner dropping; then a schedule that two workers fire once. Each step's events
// are asserted, and printed as a compact transcript (t.comment), one line per event.
import t, { type Test } from 'tap';
import { SchedulerWorker } from '../../gateway/src/workers/scheduler.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';
import { until } from './until.ts';

/** One event of the team stream as the transcript shows it. */
interface Seen {
  id: string;
  event: string;
  conversation_id?: string;
  agent_id?: string;
  kind?: string;
  stream?: string;
  stage?: string | null;
  state?: string | null;
  turn_id?: string | null;
  text: string;
  reason?: string;
}

/** The events of `raw` (an SSE response) with data, as Seen. */
function seen(raw: string): Seen[] {
  return frames(raw)
    .map(parseFrame)
    .filter((e) => e.data !== undefined)
    .map((e) => {
      const d = JSON.parse(e.data as string);
      const text = ((d.blocks ?? []) as { kind: string; body?: string }[])
        .filter((b) => b.kind === 'text')
        .map((b) => b.body ?? '')
        .join('');
      return { ...d, id: e.id ?? '', event: e.event ?? 'message', text } as Seen;
    });
}

/** One line per event: its type, id and the key fields; ids shown by short names, turns as met. */
function line(e: Seen, names: Map<string, string>): string {
  const name = (id?: string) => {
    if (!id) return '-';
    if (!names.has(id) && id.startsWith('trn_')) {
      names.set(id, `turn:${[...names.values()].filter((n) => n.startsWith('turn:')).length + 1}`);
    }
    return names.get(id) ?? id;
  };
  if (e.event !== 'message') return `${e.event.padEnd(8)} #${e.id} reason=${e.reason}`;
  const what =
    e.stream === 'stage'
      ? `stage ${e.stage} ${e.state}`
      : `output ${e.stream}${e.text ? ` text=${JSON.stringify(e.text.slice(0, 60))}` : ''}`;
  return `message  #${e.id} conv=${name(e.conversation_id)} agent=${name(e.agent_id)} turn=${name(e.turn_id ?? undefined)} ${what}`;
}

// One backend is enough to show it (the real servers when the run has them); each step is
// also covered on both backends by team.test.ts, team-lifecycle.test.ts and team-presence.test.ts.
const backend = backends()[0];

t.test(`the team as a user watches it on /api/team/stream (${backend})`, async (t) => {
  const svc = await startTestService(t, {
    backend,
    env: {
      LOG_COPY_INTERVAL_MS: '50',
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      RUNNER_HEARTBEAT_MS: '500',
      RUNNER_GRACE_MS: '3000',
      SCHEDULER_INTERVAL_MS: '0',
    },
  });
  const { http } = svc;
  const token = (await signUp(svc)).key;
  const { env, agent, runner } = await claudeOnRunner(t, svc, token);
  const names = new Map<string, string>([[agent.id, 'agent:coder']]);
  const watch = rawGet(svc, '/api/team/stream?blocks=true', { authorization: `Bearer ${token}` });
  t.teardown(() => watch.sock.destroy());
  await until('the team stream is open', () => frames(watch.text()).length > 0);

  let shown = 0;
  /** Prints the events not shown yet (what arrived between steps too). */
  const show = (t: Test, upTo: number) => {
    for (const e of seen(watch.text()).slice(shown, upTo)) t.comment(line(e, names));
    shown = Math.max(shown, upTo);
  };
  /**
   * Runs `action` under the heading `title`, waits until the events since it satisfy `done`,
   * prints them and resolves to them.
   */
  const step = async (t: Test, title: string, action: () => Promise<void>, done: (events: Seen[]) => boolean) => {
    const from = seen(watch.text()).length;
    if (from > shown) {
      t.comment('-- meanwhile');
      show(t, from);
    }
    t.comment(`-- ${title}`);
    await action();
    const events = await until(
      title,
      () => {
        const now = seen(watch.text()).slice(from);
        return done(now) ? now : undefined;
      },
      30_000,
    );
    show(t, from + events.length);
    return events;
  };
  const teamEvent = (events: Seen[]) => events.some((e) => e.event === 'team');
  const ofConversation = (events: Seen[], conversationId: string) =>
    events.filter((e) => e.event === 'message' && e.conversation_id === conversationId);
  const turnEnded = (events: Seen[]) => events.some((e) => e.stage === 'turn' && e.state === 'done');

  let first = '';
  let second = '';
  let turnId = '';

  t.test('a teammate is added: a team event', async (t) => {
    const events = await step(
      t,
      'POST /api/team (coder, named "Ada")',
      async () => {
        const added = await http.post('/api/team', { token, body: { agent_id: agent.id, name: 'Ada' } });
        t.equal(added.status, 201, added.text);
        first = added.body.conversation.id;
        names.set(first, 'conv:1');
      },
      teamEvent,
    );
    t.same(
      events.filter((e) => e.event === 'team').map((e) => e.reason),
      ['changed'],
    );
    await until(
      'online',
      async () => (await http.get(`/api/team/${agent.id}`, { token })).body.presence.state === 'online',
      30_000,
    );
  });

  t.test('it is renamed: a team event', async (t) => {
    const events = await step(
      t,
      'PATCH /api/team/coder {name: "Ada L"}',
      async () => {
        const res = await http.call('PATCH', `/api/team/${agent.id}`, { token, body: { name: 'Ada L' } });
        t.equal(res.status, 200, res.text);
        t.equal(res.body.conversation.title, 'Ada L');
      },
      teamEvent,
    );
    t.ok(teamEvent(events));
  });

  t.test('a message: its turn starts, the reply streams, the turn ends, all named', async (t) => {
    const events = await step(
      t,
      'POST /api/team/coder/messages "hello Ada"',
      async () => {
        const res = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'hello Ada' } });
        t.equal(res.status, 202, res.text);
        t.same(res.body, { status: 'queued', conversation_id: first });
      },
      turnEnded,
    );
    const mine = ofConversation(events, first);
    t.ok(
      mine.length > 0 && mine.every((e) => e.agent_id === agent.id),
      'every event names the conversation and the agent',
    );
    const turnStages = mine.filter((e) => e.stage === 'turn');
    t.same(
      turnStages.map((e) => e.state),
      ['started', 'done'],
    );
    turnId = turnStages[0]?.turn_id as string;
    const started = mine.indexOf(turnStages[0] as Seen);
    const ended = mine.indexOf(turnStages[1] as Seen);
    const reply = mine
      .slice(started, ended)
      .map((e) => e.text)
      .join('');
    t.equal(reply, 'You said: hello Ada.', 'the reply streams between the start and the end');
    t.ok(
      mine.slice(started, ended + 1).every((e) => e.turn_id === turnId),
      'under the turn',
    );
  });

  t.test('a rotation: the old conversation ends, a team event, the new one on the same machine', async (t) => {
    const events = await step(
      t,
      'POST /api/team/coder/conversations (start over)',
      async () => {
        const res = await http.post(`/api/team/${agent.id}/conversations`, { token });
        t.equal(res.status, 201, res.text);
        second = res.body.conversation.id;
        names.set(second, 'conv:2');
      },
      (events) => teamEvent(events) && events.some((e) => e.stage === 'terminate' && e.conversation_id === first),
    );
    const ended = events.find((e) => e.stage === 'terminate');
    t.match(ended, { conversation_id: first, agent_id: agent.id, state: 'done' }, 'the old one is retired');
    const team = events.findIndex((e) => e.event === 'team');
    t.ok(team >= 0, 'told the roster changed');
    t.ok(
      ofConversation(events, second).every((e) => e.agent_id === agent.id),
      'what the new one sends names it and the agent',
    );
    const mate = (await http.get(`/api/team/${agent.id}`, { token })).body;
    t.equal(mate.conversation.id, second);
  });

  t.test('its self-hosted runner drops: a team event, and the teammate is machine_offline', async (t) => {
    const events = await step(
      t,
      'the runner process is killed (SIGKILL)',
      async () => {
        runner.child.kill('SIGKILL');
      },
      teamEvent,
    );
    t.ok(teamEvent(events));
    const presence = await until(
      'machine_offline',
      async () => {
        const p = (await http.get(`/api/team/${agent.id}`, { token })).body.presence;
        return p.state === 'machine_offline' ? p : undefined;
      },
      30_000,
    );
    t.comment(`-- GET /api/team/coder: presence ${presence.state} "${presence.label}"`);
  });

  t.test('a schedule two workers run at once fires once', async (t) => {
    const made = await http.post('/api/agents', {
      token,
      body: { name: 'reporter', runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment_id: env.id },
    });
    t.equal(made.status, 201, made.text);
    const reporter = made.body as { id: string };
    names.set(reporter.id, 'agent:reporter');
    const added = await http.post('/api/team', { token, body: { agent_id: reporter.id } });
    t.equal(added.status, 201, added.text);
    const live = added.body.conversation.id as string;
    names.set(live, 'conv:3');
    await until(
      'the reporter is online',
      async () => (await http.get(`/api/team/${reporter.id}`, { token })).body.presence.state === 'online',
      30_000,
    );
    const schedule = (
      await http.post(`/api/team/${reporter.id}/schedules`, { token, body: { cron: '@hourly', prompt: 'status?' } })
    ).body as { id: string; next_run_at: string };
    names.set(schedule.id, 'schedule:hourly');
    await until('the create’s schedule event', () => seen(watch.text()).some((e) => e.event === 'schedule'));
    let clock = new Date(Date.parse(schedule.next_run_at) + 1000);
    const worker = () =>
      new SchedulerWorker(
        { sql: svc.db.sql, launch: svc.launch, now: () => clock, logger: svc.log },
        { periodMs: 0, leaseMs: 60_000 },
      );
    const workers = { a: worker(), b: worker() };
    let fired: number[] = [];
    const events = await step(
      t,
      `workers a and b pass at once, the clock at ${clock.toISOString()}`,
      async () => {
        fired = await Promise.all([workers.a.pass(), workers.b.pass()]);
        t.comment(`fire: worker a fired ${fired[0]}, worker b fired ${fired[1]}`);
      },
      (events) => events.some((e) => e.event === 'schedule') && turnEnded(ofConversation(events, live)),
    );
    t.equal((fired[0] ?? 0) + (fired[1] ?? 0), 1, 'one fire between the two');
    t.equal(events.filter((e) => e.event === 'schedule').length, 1, 'one schedule event: the fire');
    const turnStarts = ofConversation(events, live).filter((e) => e.stage === 'turn' && e.state === 'started');
    t.equal(turnStarts.length, 1, 'one turn in the teammate’s thread');
    const runs = (await http.get('/api/audit?action_prefix=team.schedule.run', { token })).body.data as {
      resource_id: string;
      metadata: { trigger: string; conversation_id: string };
    }[];
    t.equal(runs.length, 1, 'one run recorded');
    t.match(runs[0], { resource_id: schedule.id, metadata: { trigger: 'cron', conversation_id: live } });
    for (const r of runs) {
      t.comment(`run: ${names.get(r.resource_id)} trigger=${r.metadata.trigger} conv=${names.get(live)}`);
    }
    clock = new Date(clock.getTime() + 1000);
    const again = await Promise.all([workers.a.pass(), workers.b.pass()]);
    t.same(again, [0, 0], 'nothing more is due');
    t.comment(`fire: a second pass, worker a fired ${again[0]}, worker b fired ${again[1]}`);
    const row = (await http.get(`/api/team/${reporter.id}/schedules/${schedule.id}`, { token })).body;
    t.equal(row.last_conversation_id, live);
    t.comment(`-- schedule: last_run_at=${row.last_run_at} next_run_at=${row.next_run_at}`);
  });
});
