import { newId } from '@svc/core';
import { schedules } from '@svc/db';
import t from 'tap';
import { ServiceMetrics } from '../../gateway/src/metrics.ts';
import { startConversation } from '../../gateway/src/services/launch.ts';
import { claimedTurnId } from '../../gateway/src/services/schedule-runs.ts';
import { messageTeammate } from '../../gateway/src/services/team.ts';
import { SchedulerWorker } from '../../gateway/src/workers/scheduler.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';
import { eventually, until } from './until.ts';

const HOUR = 3_600_000;
const LEASE_MS = 60_000;

/** The first top of the hour strictly after `d`. */
const nextHourAfter = (d: Date) => new Date(Math.floor(d.getTime() / HOUR) * HOUR + HOUR).toISOString();

// Each backend starts a service; on a machine shared with other runs a file may take longer
// than tap's file timeout (package.json).

for (const backend of backends()) {
  t.test(`the scheduler on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      // The service's own scheduler stays off: the workers here run on a clock the test moves.
      env: { SCHEDULER_INTERVAL_MS: '0', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const token = me.key;
    const { agent } = await claudeAgent(t, http, token);
    const base = `/api/team/${agent.id}/schedules`;
    let clock = new Date();
    const metrics = new ServiceMetrics({ edgeProcess: 0 });
    const worker = () =>
      new SchedulerWorker(
        { sql: svc.db.sql, launch: svc.launch, now: () => clock, logger: svc.log, metrics },
        { periodMs: 0, leaseMs: LEASE_MS },
      );
    const [a, b] = [worker(), worker()];
    const create = async (body: Record<string, unknown>) => {
      const res = await http.post(base, { token, body: { cron: '@hourly', prompt: 'scheduled', ...body } });
      t.equal(res.status, 201, res.text);
      return res.body as { id: string; next_run_at: string };
    };
    const get = async (id: string) => (await http.get(`${base}/${id}`, { token })).body;
    const runsOf = async (id: string) =>
      (
        (await http.get('/api/audit?action_prefix=team.schedule.run&limit=500', { token })).body.data as {
          resource_id: string;
        }[]
      )
        .filter((r) => r.resource_id === id)
        .map((r) => r);
    const conversationIds = async () =>
      ((await http.get(`/api/conversations?agent_id=${agent.id}`, { token })).body.data as { id: string }[]).map(
        (c) => c.id,
      );
    const removeAll = async (ids: string[]) => {
      for (const id of ids) await http.delete(`${base}/${id}`, { token });
    };

    t.test('two workers fire each due schedule exactly once', async (t) => {
      const inThread = await Promise.all(Array.from({ length: 6 }, (_, i) => create({ name: `s${i}` })));
      const fresh = await create({ one_off: true, prompt: 'fresh every hour' });
      const all = [...inThread, fresh];
      const before = await conversationIds();
      clock = new Date(Date.parse(fresh.next_run_at) + 1000);
      const fired = await Promise.all([a.pass(), b.pass()]);
      t.equal(fired[0] + fired[1], all.length, 'every due schedule fired, by one worker or the other');
      for (const s of all) {
        const runs = await runsOf(s.id);
        t.equal(runs.length, 1, `${s.id} ran once`);
        t.match(runs[0], { actor: 'system', metadata: { trigger: 'cron' } });
        const after = await get(s.id);
        t.equal(after.next_run_at, nextHourAfter(clock), 'moved to the next slot after the clock');
        t.equal(after.last_run_at, clock.toISOString());
      }
      t.match((await get(inThread[0]?.id as string)).last_error, /not on the team/);
      const opened = (await conversationIds()).filter((id) => !before.includes(id));
      t.equal(opened.length, 1, 'the one-off schedule opened one conversation');
      const stamped = await get(fresh.id);
      t.same([stamped.last_conversation_id, stamped.last_error], [opened[0], null]);
      const turns = (await http.get(`/api/conversations/${opened[0]}/turns`, { token })).body.data;
      t.equal(turns[0]?.prompt, 'fresh every hour');
      t.same(await Promise.all([a.pass(), b.pass()]), [0, 0], 'nothing is due until the next slot');
      const scrape = (await metrics.scrape()).body;
      t.match(
        scrape,
        /^svc_schedule_runs_total\{outcome="started",edge_process="0"\} 1$/m,
        'the run that began, counted',
      );
      t.match(
        scrape,
        /^svc_schedule_runs_total\{outcome="failed",edge_process="0"\} 6$/m,
        'and the six that could not',
      );
      await removeAll(all.map((s) => s.id));
    });

    t.test('two workers at once, 20 rounds in a row: each due schedule fires exactly once a round', async (t) => {
      const due = await Promise.all(Array.from({ length: 4 }, (_, i) => create({ name: `r${i}` })));
      clock = new Date(Math.max(...due.map((s) => Date.parse(s.next_run_at))) + 1000);
      for (let round = 1; round <= 20; round++) {
        const fired = await Promise.all([a.pass(), b.pass()]);
        t.equal(fired[0] + fired[1], due.length, `round ${round}: every due schedule fired, by one worker`);
        for (const s of due) {
          const row = await get(s.id);
          t.equal(row.last_run_at, clock.toISOString(), `round ${round}: ${s.id} stamped at this round`);
          t.equal(row.next_run_at, nextHourAfter(clock), `round ${round}: ${s.id} moved to the next slot`);
          t.equal((await runsOf(s.id)).length, round, `round ${round}: ${s.id} has one run per round`);
        }
        t.same(await Promise.all([a.pass(), b.pass()]), [0, 0], `round ${round}: nothing left due`);
        clock = new Date(clock.getTime() + HOUR);
      }
      await removeAll(due.map((s) => s.id));
    });

    t.test('a scheduled fire tells /api/team/stream', async (t) => {
      // Every change written so far is in the log first, so the stream opens after all of them.
      await svc.relay.flush(me.accountId);
      const w = rawGet(svc, '/api/team/stream', { authorization: `Bearer ${token}` });
      t.teardown(() => w.sock.destroy());
      const changes = () =>
        frames(w.text())
          .map(parseFrame)
          .filter((e) => e.event === 'schedule');
      t.ok(await eventually(() => frames(w.text()).some((f) => parseFrame(f).id !== undefined), 10_000));
      const s = await create({});
      t.ok(await eventually(() => changes().length === 1, 15_000), 'told of the create');
      clock = new Date(Date.parse(s.next_run_at) + 1000);
      t.equal(await a.pass(), 1);
      t.ok(await eventually(() => changes().length === 2, 15_000), 'told of the fire');
      t.same(JSON.parse(changes()[1]?.data as string), { reason: 'changed' });
      await removeAll([s.id]);
    });

    t.test('after downtime a missed schedule fires once, and next from now', async (t) => {
      const s = await create({});
      clock = new Date(Date.parse(s.next_run_at) + 5 * HOUR + 30 * 60_000);
      t.equal(await a.pass(), 1);
      t.equal((await runsOf(s.id)).length, 1, 'once, not once per missed slot');
      t.equal((await get(s.id)).next_run_at, nextHourAfter(clock));
      t.equal(await b.pass(), 0);
      await removeAll([s.id]);
    });

    t.test('a disabled schedule never fires', async (t) => {
      const s = await create({ enabled: false });
      clock = new Date(clock.getTime() + 48 * HOUR);
      t.equal(await a.pass(), 0);
      t.same(await runsOf(s.id), []);
      await removeAll([s.id]);
    });

    t.test('a worker that outlived its lease stamps nothing once another took the row over', async (t) => {
      const s = await create({});
      const claimedAt = new Date(Date.parse(s.next_run_at) + 1000);
      const [slow] = await schedules.claimDue(svc.db.sql, claimedAt, new Date(claimedAt.getTime() + LEASE_MS), 50, () =>
        newId('cnv'),
      );
      t.equal(slow?.id, s.id);
      clock = new Date(claimedAt.getTime() + LEASE_MS + 1000);
      t.equal(await b.pass(), 1, 'the expired lease is taken over');
      const stamped = await get(s.id);
      t.equal(stamped.last_run_at, clock.toISOString());
      await a.fire(slow as schedules.ScheduleRow, claimedAt);
      t.equal((await runsOf(s.id)).length, 1, 'one run recorded, not two');
      t.same(await get(s.id), stamped, 'the late stamp changed nothing');
      await removeAll([s.id]);
    });

    t.test('an edit made while a run is under way keeps the next_run_at it computed', async (t) => {
      const s = await create({});
      clock = new Date(Date.parse(s.next_run_at) + 1000);
      const claimNow = async () =>
        (await schedules.claimDue(svc.db.sql, clock, new Date(clock.getTime() + LEASE_MS), 50, () => newId('cnv')))[0];
      const first = await claimNow();
      t.equal(first?.id, s.id);
      const off = await http.call('PATCH', `${base}/${s.id}`, { token, body: { enabled: false } });
      t.equal(off.body.next_run_at, null);
      await a.fire(first as schedules.ScheduleRow, clock);
      const afterOff = await get(s.id);
      t.equal(afterOff.last_run_at, clock.toISOString(), 'the run is recorded');
      t.equal(afterOff.next_run_at, null, 'still disabled: no next run');
      t.equal((await runsOf(s.id)).length, 1);

      const on = await http.call('PATCH', `${base}/${s.id}`, { token, body: { enabled: true } });
      clock = new Date(Date.parse(on.body.next_run_at) + 1000);
      const second = await claimNow();
      t.equal(second?.id, s.id);
      const yearly = await http.call('PATCH', `${base}/${s.id}`, { token, body: { cron: '0 0 1 1 *' } });
      t.match(yearly.body.next_run_at, /-01-01T00:00:00\.000Z$/);
      await a.fire(second as schedules.ScheduleRow, clock);
      const afterCron = await get(s.id);
      t.equal(afterCron.last_run_at, clock.toISOString(), 'the run is recorded');
      t.equal(afterCron.next_run_at, yearly.body.next_run_at, 'the slot of the new expression, not of the old one');
      t.equal((await runsOf(s.id)).length, 2);
      await removeAll([s.id]);
    });

    t.test('a claim whose worker died before an edit moved the slot is not the new slot’s run', async (t) => {
      const [earlier] = await conversationIds();
      t.ok(earlier, 'a conversation of the account to stand for the dead worker’s launch');
      const s = await create({});
      clock = new Date(Date.parse(s.next_run_at) + 1000);
      // The dead worker claimed the row and launched under the claim's id (`earlier`), then died.
      const [dead] = await schedules.claimDue(svc.db.sql, clock, new Date(clock.getTime() + LEASE_MS), 50, () =>
        String(earlier),
      );
      t.equal(dead?.claim_conversation_id, earlier);
      const edited = await http.call('PATCH', `${base}/${s.id}`, { token, body: { cron: '30 * * * *' } });
      t.equal(edited.status, 200);
      clock = new Date(Math.max(Date.parse(edited.body.next_run_at), clock.getTime() + LEASE_MS) + 1000);
      t.equal(await b.pass(), 1, 'the new slot fires once its turn comes');
      const after = await get(s.id);
      t.not(after.last_conversation_id, earlier, 'the old slot’s launch is not passed off as this run');
      t.match(after.last_error, /not on the team/, 'this run went where an in-thread schedule goes');
      t.equal((await runsOf(s.id)).length, 1);
      await removeAll([s.id]);
    });

    t.test('a worker killed mid-fire: the run is neither lost nor launched twice', async (t) => {
      const s = await create({ one_off: true, prompt: 'exactly once' });
      clock = new Date(Date.parse(s.next_run_at) + 1000);
      // What a worker did before it died: it claimed the row and launched, but never stamped.
      const [claim] = await schedules.claimDue(svc.db.sql, clock, new Date(clock.getTime() + LEASE_MS), 50, () =>
        newId('cnv'),
      );
      t.equal(claim?.id, s.id);
      const who = { accountId: me.accountId, actor: 'system' as const, ip: null };
      const launched = await startConversation(svc.launch, who, { agent_id: agent.id, prompt: 'exactly once' }, null, {
        conversationId: claim?.claim_conversation_id as string,
      });
      const before = await conversationIds();
      t.equal(await b.pass(), 0, 'the live lease keeps the row from the other worker');
      clock = new Date(clock.getTime() + LEASE_MS + 1000);
      t.equal(await b.pass(), 1, 'the expired lease is taken over');
      t.same(await conversationIds(), before, 'no second conversation');
      const after = await get(s.id);
      t.equal(after.last_conversation_id, launched.id, 'the dead worker’s launch is the run');
      t.equal(after.next_run_at, nextHourAfter(clock));
      t.equal((await runsOf(s.id)).length, 1);

      // Killed after claiming and before launching: the next claimant launches it, once.
      clock = new Date(Date.parse(after.next_run_at) + 1000);
      const [second] = await schedules.claimDue(svc.db.sql, clock, new Date(clock.getTime() + LEASE_MS), 50, () =>
        newId('cnv'),
      );
      t.equal(second?.id, s.id);
      clock = new Date(clock.getTime() + LEASE_MS + 1000);
      t.equal(await a.pass(), 1);
      const opened = (await conversationIds()).filter((id) => !before.includes(id));
      t.same(opened, [second?.claim_conversation_id], 'launched under the claim’s id, not lost');
      t.equal((await get(s.id)).last_conversation_id, second?.claim_conversation_id);
      t.equal((await runsOf(s.id)).length, 2);
    });

    t.test('an in-thread run whose worker died after the message is not sent twice', async (t) => {
      const added = await http.post('/api/team', { token, body: { agent_id: agent.id } });
      t.equal(added.status, 201, added.text);
      const live = added.body.conversation.id as string;
      const turns = async () =>
        ((await http.get(`/api/conversations/${live}/turns`, { token })).body.data as unknown[]).length;
      const s = await create({ prompt: 'in the thread, once' });
      clock = new Date(Date.parse(s.next_run_at) + 1000);
      // What a worker did before it died: it claimed the row and sent the message, but never stamped.
      const [claim] = await schedules.claimDue(svc.db.sql, clock, new Date(clock.getTime() + LEASE_MS), 50, () =>
        newId('cnv'),
      );
      t.equal(claim?.id, s.id);
      const who = { accountId: me.accountId, actor: 'system' as const, ip: null };
      await until('the teammate is online', async () => {
        const mate = (await http.get(`/api/team/${agent.id}`, { token })).body;
        return mate.presence?.state === 'online';
      });
      const sent = await messageTeammate(
        { launch: svc.launch },
        who,
        agent.id,
        { prompt: 'in the thread, once' },
        { turnId: claimedTurnId(claim?.claim_conversation_id as string) },
      );
      t.equal(sent.conversationId, live);
      const before = await turns();
      clock = new Date(clock.getTime() + LEASE_MS + 1000);
      t.equal(await b.pass(), 1, 'the expired lease is taken over');
      t.equal(await turns(), before, 'no second message');
      const after = await get(s.id);
      t.equal(after.last_conversation_id, live, 'the dead worker’s message is the run');
      t.equal(after.last_error, null);
      t.equal((await runsOf(s.id)).length, 1);
    });
  });
}
