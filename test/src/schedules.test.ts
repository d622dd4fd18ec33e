import t from 'tap';
import { backends, signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';
import { eventually } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = (check: () => boolean | Promise<boolean>, ms = 5000) => eventually(check, ms);

/** The next midnight UTC strictly after `iso`. */
function nextMidnightAfter(iso: string): string {
  const d = new Date(iso);
  return new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate() + 1)).toISOString();
}

for (const backend of backends()) {
  t.test(`schedules on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: { LOG_COPY_INTERVAL_MS: '50', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, SCHEDULER_INTERVAL_MS: '0' },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const other = await signUp(svc);
    const token = me.key;
    const agentOf = async (key: string, name: string) => {
      const env = (await http.post('/api/environments', { token: key, body: { name: `env-${name}` } })).body;
      const body = { name, runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', environment_id: env.id };
      return (await http.post('/api/agents', { token: key, body })).body as { id: string };
    };
    const agent = await agentOf(token, 'reporter');
    const second = await agentOf(token, 'second');
    const theirs = await agentOf(other.key, 'theirs');
    const base = `/api/team/${agent.id}/schedules`;

    t.test('a schedule is created with defaults and next_run_at computed in UTC', async (t) => {
      const res = await http.post(base, { token, body: { cron: '@daily', prompt: 'Summarise the day' } });
      t.equal(res.status, 201);
      t.match(res.body, {
        agent_id: agent.id,
        name: '',
        cron: '@daily',
        prompt: 'Summarise the day',
        one_off: false,
        enabled: true,
        last_run_at: null,
        last_conversation_id: null,
        last_error: null,
      });
      t.equal(res.body.next_run_at, nextMidnightAfter(res.body.created_at));
      t.same((await http.get(`${base}/${res.body.id}`, { token })).body, res.body);

      const weekdays = await http.post(base, { token, body: { cron: '30 9 * * 1-5', prompt: 'standup', name: 'am' } });
      t.equal(weekdays.status, 201);
      const next = new Date(weekdays.body.next_run_at);
      t.equal(next.getUTCHours(), 9);
      t.equal(next.getUTCMinutes(), 30);
      t.ok([1, 2, 3, 4, 5].includes(next.getUTCDay()), 'on a weekday');
      t.ok(next > new Date(weekdays.body.created_at));
    });

    t.test('@reboot and malformed expressions are 422 naming cron', async (t) => {
      for (const cron of ['@reboot', '* * * * * *', '0 9 * *', '61 * * * *', '@fortnightly', 'every day']) {
        const res = await http.post(base, { token, body: { cron, prompt: 'x' } });
        t.equal(res.status, 422, cron);
        t.equal(res.body.error, 'validation_failed', cron);
        t.ok(res.body.details?.cron?.length, `${cron}: details.cron`);
      }
      const made = await http.post(base, { token, body: { cron: '@hourly', prompt: 'x' } });
      const bad = await http.call('PATCH', `${base}/${made.body.id}`, { token, body: { cron: '@reboot' } });
      t.equal(bad.status, 422);
      t.match(bad.body.details.cron[0], /@reboot/);
      t.equal((await http.get(`${base}/${made.body.id}`, { token })).body.cron, '@hourly', 'unchanged');
    });

    t.test('a disabled schedule has no next run; enabling computes it', async (t) => {
      const res = await http.post(base, { token, body: { cron: '@daily', prompt: 'p', enabled: false } });
      t.equal(res.status, 201);
      t.equal(res.body.next_run_at, null);
      const on = await http.call('PATCH', `${base}/${res.body.id}`, {
        token,
        body: { enabled: true, name: 'nightly' },
      });
      t.equal(on.status, 200);
      t.match(on.body, { enabled: true, name: 'nightly', prompt: 'p' });
      t.equal(on.body.next_run_at, nextMidnightAfter(on.body.updated_at));
      const off = await http.call('PATCH', `${base}/${res.body.id}`, { token, body: { enabled: false } });
      t.equal(off.body.next_run_at, null);
    });

    t.test('next_run_at is computed again when cron changes, and kept when only other fields do', async (t) => {
      const made = (await http.post(base, { token, body: { cron: '@daily', prompt: 'p' } })).body;
      const renamed = await http.call('PATCH', `${base}/${made.id}`, { token, body: { name: 'renamed', prompt: 'q' } });
      t.equal(renamed.status, 200);
      t.equal(renamed.body.next_run_at, made.next_run_at, 'unchanged by a rename');
      const hourly = await http.call('PATCH', `${base}/${made.id}`, { token, body: { cron: '0 * * * *' } });
      t.equal(hourly.status, 200);
      const d = new Date(hourly.body.updated_at);
      const nextHour = new Date(Math.floor(d.getTime() / 3_600_000) * 3_600_000 + 3_600_000).toISOString();
      t.equal(hourly.body.next_run_at, nextHour, 'the first slot of the new expression after the edit');
      t.equal((await http.get(`${base}/${made.id}`, { token })).body.next_run_at, nextHour, 'as stored');
      t.equal((await http.delete(`${base}/${made.id}`, { token })).status, 204);
    });

    t.test('lists: every schedule soonest first, and one agent’s', async (t) => {
      const yearly = (
        await http.post(`/api/team/${second.id}/schedules`, { token, body: { cron: '@yearly', prompt: 'y' } })
      ).body;
      const soon = (await http.post(base, { token, body: { cron: '* * * * *', prompt: 'now' } })).body;
      const all = (await http.get('/api/team/schedules', { token })).body.data as { id: string; next_run_at: string }[];
      // Due at the same minute (at hh:59 the @hourly one made above is too), ties go by id.
      const first = all.filter((s) => s.next_run_at === all[0]?.next_run_at).map((s) => s.id);
      t.equal(all[0]?.next_run_at, soon.next_run_at, 'the every-minute one is due soonest');
      t.ok(first.includes(soon.id), 'the every-minute one among the first');
      t.same(first, [...first].sort(), 'ties by id');
      const times = all.map((s) => s.next_run_at);
      const dated = times.filter((x) => x !== null);
      t.same(dated, [...dated].sort(), 'ascending');
      t.same(
        times.slice(dated.length),
        times.slice(dated.length).map(() => null),
        'disabled ones last',
      );
      const ofSecond = (await http.get(`/api/team/${second.id}/schedules`, { token })).body.data;
      t.same(
        ofSecond.map((s: { id: string }) => s.id),
        [yearly.id],
      );
      t.equal((await http.get('/api/team/schedules', { token: other.key })).body.data.length, 0, 'none of mine');
    });

    t.test('a row addressed under another agent’s path, or another tenant’s, is 404', async (t) => {
      const s = (await http.post(base, { token, body: { cron: '@weekly', prompt: 'w' } })).body;
      const wrong = `/api/team/${second.id}/schedules/${s.id}`;
      t.match((await http.get(wrong, { token })).body, { error: 'not_found' });
      t.equal((await http.call('PATCH', wrong, { token, body: { name: 'n' } })).status, 404);
      t.equal((await http.delete(wrong, { token })).status, 404);
      const mine = `${base}/${s.id}`;
      t.match((await http.get(mine, { token: other.key })).body, { error: 'not_found' });
      t.equal((await http.call('PATCH', mine, { token: other.key, body: { name: 'n' } })).status, 404);
      t.equal((await http.delete(mine, { token: other.key })).status, 404);
      t.equal((await http.get(base, { token: other.key })).status, 404, 'my agent is unknown to them');
      const onTheirs = await http.post(`/api/team/${theirs.id}/schedules`, {
        token,
        body: { cron: '@daily', prompt: 'x' },
      });
      t.match(onTheirs.body, { error: 'not_found' });
      t.equal((await http.get(mine, { token })).body.name, '', 'untouched');
      t.equal((await http.delete(mine, { token })).status, 204);
      t.equal((await http.get(mine, { token })).status, 404);
    });

    t.test('create, update and delete are audited without the prompt', async (t) => {
      const s = (await http.post(base, { token, body: { cron: '@daily', prompt: 'secret words' } })).body;
      await http.call('PATCH', `${base}/${s.id}`, { token, body: { prompt: 'other words' } });
      await http.delete(`${base}/${s.id}`, { token });
      const rows = (await http.get('/api/audit?action_prefix=team.schedule.', { token })).body.data.filter(
        (r: { resource_id: string }) => r.resource_id === s.id,
      );
      t.same(
        rows.map((r: { action: string }) => r.action),
        ['team.schedule.delete', 'team.schedule.update', 'team.schedule.create'],
      );
      t.match(rows[1].metadata, { fields: ['prompt'] });
      t.notOk(JSON.stringify(rows).includes('words'), 'no prompt text');
    });

    t.test(
      'run now of an in-thread schedule: 404 while the agent is not on the team, stamped and audited',
      async (t) => {
        const s = (await http.post(base, { token, body: { cron: '@daily', prompt: 'in thread' } })).body;
        const res = await http.post(`${base}/${s.id}/run`, { token });
        t.equal(res.status, 404);
        t.equal(res.body.error, 'not_found');
        t.match(res.body.message, /not on the team/);
        const after = (await http.get(`${base}/${s.id}`, { token })).body;
        t.ok(after.last_run_at, 'last_run_at stamped');
        t.match(after.last_error, /not on the team/);
        t.equal(after.last_conversation_id, null);
        t.equal(after.next_run_at, s.next_run_at, 'the next slot is unchanged');
        const audit = (await http.get('/api/audit?action_prefix=team.schedule.run', { token })).body.data;
        t.match(audit[0], {
          action: 'team.schedule.run',
          resource_id: s.id,
          metadata: { trigger: 'now', error: 'not_found', conversation_id: null },
        });
        t.equal(
          (await http.post(`/api/team/${second.id}/schedules/${s.id}/run`, { token })).status,
          404,
          'wrong agent',
        );
        t.equal((await http.post(`${base}/${s.id}/run`, { token: other.key })).status, 404, 'another tenant');
      },
    );

    t.test('run now of a one-off schedule opens a fresh conversation with the prompt', async (t) => {
      const s = (await http.post(base, { token, body: { cron: '@daily', prompt: 'fresh run', one_off: true } })).body;
      const refused = await http.post(`${base}/${s.id}/run`, { token });
      t.equal(refused.status, 422, 'no inference credential yet');
      t.equal(refused.body.error, 'missing_credential');
      const failed = (await http.get(`${base}/${s.id}`, { token })).body;
      t.ok(failed.last_run_at, 'stamped when it could not start');
      t.equal(failed.last_error, refused.body.message);

      const credential = await http.put('/api/account/inference-credentials/anthropic_api_key', {
        token,
        body: { value: 'sk-ant-test-credential-123456' },
      });
      t.equal(credential.status, 200);
      const res = await http.post(`${base}/${s.id}/run`, { token });
      t.equal(res.status, 202);
      t.same(Object.keys(res.body).sort(), ['conversation_id', 'status']);
      t.equal(res.body.status, 'queued');
      const conversation = (await http.get(`/api/conversations/${res.body.conversation_id}`, { token })).body;
      t.equal(conversation.agent_id, agent.id);
      const turns = (await http.get(`/api/conversations/${res.body.conversation_id}/turns`, { token })).body.data;
      t.equal(turns[0]?.prompt, 'fresh run');
      const after = (await http.get(`${base}/${s.id}`, { token })).body;
      t.equal(after.last_conversation_id, res.body.conversation_id);
      t.equal(after.last_error, null, 'the error of the failed run is cleared');
      t.ok(after.last_run_at >= failed.last_run_at);

      const again = await http.post(`${base}/${s.id}/run`, { token });
      t.equal(again.status, 202);
      t.not(again.body.conversation_id, res.body.conversation_id, 'each run opens its own conversation');
      const done = await until(async () => {
        const list = (await http.get(`/api/conversations/${again.body.conversation_id}/turns`, { token })).body.data;
        return list[0]?.state !== 'running';
      }, 30_000);
      t.ok(done, 'the turn ran to its end');
    });

    t.test('/api/team/stream tells of each create, update, delete and run', async (t) => {
      const w = rawGet(svc, '/api/team/stream', { authorization: `Bearer ${token}` });
      t.teardown(() => w.sock.destroy());
      const changes = () =>
        frames(w.text())
          .map(parseFrame)
          .filter((e) => e.event === 'schedule');
      await sleep(200);
      const before = changes().length;
      const s = (await http.post(base, { token, body: { cron: '@daily', prompt: 'p' } })).body;
      t.ok(await until(() => changes().length > before), 'told of the create');
      t.same(JSON.parse(changes().at(-1)?.data as string), { reason: 'changed' });
      const beforeUpdate = changes().length;
      await http.call('PATCH', `${base}/${s.id}`, { token, body: { name: 'renamed' } });
      t.ok(await until(() => changes().length > beforeUpdate), 'told of the update');
      const afterCreate = changes().length;
      await http.delete(`${base}/${s.id}`, { token });
      t.ok(await until(() => changes().length > afterCreate), 'told of the delete');
      const fired = (await http.post(base, { token, body: { cron: '@daily', prompt: 'p' } })).body;
      t.ok(await until(() => changes().length > afterCreate + 1), 'told of the create');
      const afterSecond = changes().length;
      t.equal((await http.post(`${base}/${fired.id}/run`, { token })).status, 404, 'the agent is not on the team');
      t.ok(await until(() => changes().length > afterSecond), 'told of the run, which was stamped');
    });

    t.test('run now of an in-thread schedule is a message in the teammate’s own conversation', async (t) => {
      const mate = await agentOf(token, 'mate');
      const mateBase = `/api/team/${mate.id}/schedules`;
      const added = await http.post('/api/team', { token, body: { agent_id: mate.id } });
      t.equal(added.status, 201, added.text);
      const live = added.body.conversation.id as string;
      t.ok(
        await until(
          async () => (await http.get(`/api/team/${mate.id}`, { token })).body.presence.state === 'online',
          30_000,
        ),
        'its machine is up',
      );
      const turnsOf = async () => (await http.get(`/api/conversations/${live}/turns`, { token })).body.data;
      const s = (await http.post(mateBase, { token, body: { cron: '@daily', prompt: 'slow daily report' } })).body;
      const res = await http.post(`${mateBase}/${s.id}/run`, { token });
      t.equal(res.status, 202, res.text);
      t.same(res.body, { status: 'queued', conversation_id: live }, 'the live conversation');
      t.equal((await turnsOf())[0]?.prompt, 'slow daily report', 'the prompt is its next turn');
      const stamped = (await http.get(`${mateBase}/${s.id}`, { token })).body;
      t.equal(stamped.last_conversation_id, live);
      t.equal(stamped.last_error, null);

      const busy = await http.post(`${mateBase}/${s.id}/run`, { token });
      t.equal(busy.status, 400, 'the previous turn still runs');
      t.equal(busy.body.error, 'conversation_busy');
      t.equal((await http.get(`${mateBase}/${s.id}`, { token })).body.last_error, busy.body.message, 'stamped');
      t.ok(await until(async () => (await turnsOf())[0]?.state === 'done', 30_000), 'the turn ran to its end');
      t.equal((await turnsOf()).length, 1, 'the refused run recorded no turn');
    });

    t.test('a one-off run of a persistent teammate opens its conversation on a new machine', async (t) => {
      const env = (await http.post('/api/environments', { token, body: { name: 'env-lasting' } })).body;
      const made = await http.post('/api/agents', {
        token,
        body: {
          name: 'lasting',
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: env.id,
          sandbox_mode: 'persistent',
        },
      });
      t.equal(made.status, 201, made.text);
      const lasting = made.body as { id: string };
      const added = await http.post('/api/team', { token, body: { agent_id: lasting.id } });
      t.equal(added.status, 201, added.text);
      const machine = added.body.conversation.sandbox_id as string;
      t.ok(
        await until(
          async () => (await http.get(`/api/team/${lasting.id}`, { token })).body.presence.state === 'online',
          30_000,
        ),
        'its lasting machine is up',
      );
      const s = (
        await http.post(`/api/team/${lasting.id}/schedules`, {
          token,
          body: { cron: '@daily', prompt: 'one-off report', one_off: true },
        })
      ).body;
      const res = await http.post(`/api/team/${lasting.id}/schedules/${s.id}/run`, { token });
      t.equal(res.status, 202, res.text);
      t.not(res.body.conversation_id, added.body.conversation.id, 'not the teammate’s conversation');
      const conversation = (await http.get(`/api/conversations/${res.body.conversation_id}`, { token })).body;
      t.equal(conversation.agent_id, lasting.id);
      t.ok(conversation.sandbox_id, 'on a sandbox');
      t.not(conversation.sandbox_id, machine, 'a new machine, not the lasting one');
      const sandbox = (await http.get(`/api/sandboxes/${conversation.sandbox_id}`, { token })).body;
      t.match(sandbox, { mode: 'ephemeral', agent_id: lasting.id, environment_id: env.id });
      const teammate = (await http.get(`/api/team/${lasting.id}`, { token })).body;
      t.equal(teammate.conversation.id, added.body.conversation.id, 'the teammate keeps its live conversation');
      t.equal(teammate.conversation.sandbox_id, machine, 'on its lasting machine');
      t.ok(
        await until(async () => {
          const list = (await http.get(`/api/conversations/${res.body.conversation_id}/turns`, { token })).body.data;
          return list[0]?.state === 'done';
        }, 30_000),
        'the run’s turn ran to its end',
      );
      t.equal(
        (await http.get(`/api/conversations/${added.body.conversation.id}/turns`, { token })).body.data.length,
        0,
        'nothing was sent to the teammate’s thread',
      );
    });
  });
}
