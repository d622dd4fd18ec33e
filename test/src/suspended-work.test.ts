import { schedules } from '@svc/db';
import t from 'tap';
import { SUSPENDED_MESSAGE } from '../../gateway/src/services/account-standing.ts';
import { sendPrompt, startConversation } from '../../gateway/src/services/launch.ts';
import { messageTeammate } from '../../gateway/src/services/team.ts';
import { SchedulerWorker } from '../../gateway/src/workers/scheduler.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { eventually } from './until.ts';

const HOUR = 3_600_000;
const ADMIN = 'ops@suspended-work.example.test';

/** The first top of the hour strictly after `d`. */
const nextHourAfter = (d: Date) => new Date(Math.floor(d.getTime() / HOUR) * HOUR + HOUR).toISOString();

// Each backend builds three machines (the team's, then a one-off's and a fresh team one's).

for (const backend of backends()) {
  t.test(`a suspended account's work does not start (${backend})`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      // The service's own scheduler stays off: the worker here runs on a clock the test moves.
      env: { SCHEDULER_INTERVAL_MS: '0', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, ADMIN_EMAILS: ADMIN },
    });
    const { http } = svc;
    let clock = new Date();
    const worker = new SchedulerWorker(
      { sql: svc.db.sql, launch: svc.launch, now: () => clock, logger: svc.log },
      { periodMs: 0, leaseMs: 60_000 },
    );
    const op = await signUp(svc, ADMIN);
    const sus = await signUp(svc);
    const { agent: mate } = await claudeAgent(t, http, sus.key);
    const added = await http.post('/api/team', { token: sus.key, body: { agent_id: mate.id } });
    t.equal(added.status, 201, added.text);
    const teamConversation = added.body.conversation.id as string;
    const make = async (body: Record<string, unknown>) => {
      const res = await http.post(`/api/team/${mate.id}/schedules`, {
        token: sus.key,
        body: { cron: '@hourly', prompt: 'while suspended', ...body },
      });
      t.equal(res.status, 201, res.text);
      return res.body as { id: string; next_run_at: string };
    };
    const oneOff = await make({ one_off: true });
    const inThread = await make({});
    const row = async (id: string) => schedules.getSchedule(svc.db.sql, sus.accountId, mate.id, id);
    const counts = async () =>
      (
        await svc.db.sql<{ conversations: number; active: number }[]>`
          SELECT (SELECT count(*)::int FROM conversations WHERE account_id = ${sus.accountId}) AS conversations,
            (SELECT count(*)::int FROM sandboxes WHERE account_id = ${sus.accountId}
               AND status IN ('provisioning', 'ready', 'suspended')) AS active`
      )[0];
    const suspend = async (suspended: boolean) => {
      const res = await http.post(`/api/admin/users/${sus.accountId}/suspend`, {
        token: op.key,
        body: { suspended },
      });
      t.equal(res.status, 200, res.text);
    };

    await suspend(true);
    t.same(await counts(), { conversations: 1, active: 0 }, 'its team machine was stopped');
    const itsSandboxes = (
      await svc.db.sql<{ id: string }[]>`SELECT id FROM sandboxes WHERE account_id = ${sus.accountId}`
    ).map((r) => r.id);
    t.ok(
      await eventually(() => svc.local.held().every((h) => !itsSandboxes.includes(h.sandboxId)), 20_000),
      'no machine of it runs',
    );

    t.test('its due schedules fire without launching: last_error says why, once a slot', async (t) => {
      clock = new Date(Math.max(Date.parse(oneOff.next_run_at), Date.parse(inThread.next_run_at)) + 1000);
      t.equal(await worker.pass(), 2, 'both schedules came due and were fired');
      for (const s of [oneOff, inThread]) {
        const after = await row(s.id);
        t.equal(after?.last_error, SUSPENDED_MESSAGE, `${s.id}: last_error says the account is suspended`);
        t.equal(after?.last_conversation_id, null, `${s.id}: no conversation`);
        t.equal(after?.last_run_at?.toISOString(), clock.toISOString());
        t.equal(after?.next_run_at?.toISOString(), nextHourAfter(clock), `${s.id}: moved to the next slot`);
        t.equal(after?.claimed_until, null, `${s.id}: its claim is released`);
      }
      t.same(await counts(), { conversations: 1, active: 0 }, 'nothing was launched, no sandbox built');
      t.equal(await worker.pass(), 0, 'not fired again before its next slot');
      const [audit] = await svc.db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM audit_events
        WHERE account_id = ${sus.accountId} AND action = 'team.schedule.run'
          AND metadata->>'error' = 'account_suspended'`;
      t.equal(audit?.n, 2, 'each run is audited with the code account_suspended');
    });

    t.test('a launch, a prompt and a team message are refused 403 account_suspended, whoever asks', async (t) => {
      const refused = { code: 'account_suspended', status: 403, message: SUSPENDED_MESSAGE };
      for (const actor of ['api', 'system'] as const) {
        const who = { accountId: sus.accountId, actor, ip: null };
        await t.rejects(startConversation(svc.launch, who, { agent_id: mate.id, prompt: 'launch' }), refused);
        await t.rejects(sendPrompt(svc.launch, who, teamConversation, { prompt: 'prompt' }), refused);
        await t.rejects(messageTeammate({ launch: svc.launch }, who, mate.id, { prompt: 'team message' }), refused);
      }
      t.same(await counts(), { conversations: 1, active: 0 }, 'still nothing launched');
    });

    t.test('restored, its next slot launches again', async (t) => {
      await suspend(false);
      clock = new Date(clock.getTime() + HOUR);
      t.equal(await worker.pass(), 2, 'the next slot fires both');
      const launched = await row(oneOff.id);
      t.equal(launched?.last_error, null, 'the one-off run launched');
      t.match(launched?.last_conversation_id, /^cnv_/);
      const threaded = await row(inThread.id);
      t.equal(threaded?.last_error, null, 'the in-thread run opened a fresh team conversation');
      t.not(threaded?.last_conversation_id, teamConversation, 'not the one the suspension ended');
      t.equal((await counts())?.conversations, 3);
    });
  });
}
