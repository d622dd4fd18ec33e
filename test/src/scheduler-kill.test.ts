// A scheduler worker PROCESS killed with SIGKILL in the middle of a fire: another worker then
// completes the run exactly once (neither lost nor launched twice).
//
// The fire is held mid-way by the database, not by timing: the test locks the audit table, so
// the child's fire stops at its first audit row, which a one-off run writes right after its
// launch has committed (conversation.created) and before its stamp. The test sees the child's
// statement waiting on that lock, kills the child there, and releases the lock.
//
// Postgres backend only: a worker in another process needs a database two processes share;
// the embedded PostgreSQL serves the one process that holds DATA_DIR and stops with it.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import postgres from 'postgres';
import t from 'tap';
import { SchedulerWorker } from '../../gateway/src/workers/scheduler.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { eventually, until } from './until.ts';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');
/** The lease a node's scheduler takes on a claim (main.ts): the next worker waits it out. */
const NODE_LEASE_MS = 5 * 60_000;

t.test(
  'a scheduler worker process killed with SIGKILL mid-fire: another completes the run once',
  { skip: !backends().includes('postgres+redis') && 'needs the Postgres of the run' },
  async (t) => {
    const svc = await startTestService(t, {
      backend: 'postgres+redis',
      env: { SCHEDULER_INTERVAL_MS: '0', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const token = me.key;
    const { agent } = await claudeAgent(t, http, token);
    const base = `/api/team/${agent.id}/schedules`;
    const made = await http.post(base, { token, body: { cron: '@hourly', prompt: 'exactly once', one_off: true } });
    t.equal(made.status, 201, made.text);
    const scheduleId = made.body.id as string;
    const conversationsOf = async () =>
      ((await http.get(`/api/conversations?agent_id=${agent.id}`, { token })).body.data as { id: string }[]).map(
        (c) => c.id,
      );
    const runs = async () =>
      (
        (await http.get('/api/audit?action_prefix=team.schedule.run', { token })).body.data as {
          resource_id: string;
          metadata: { trigger: string; conversation_id: string | null };
        }[]
      ).filter((r) => r.resource_id === scheduleId);

    // The second node, in a process of its own, with its scheduler on.
    const dataDir = await mkdtemp(join(tmpdir(), 'svc-scheduler-node-'));
    t.teardown(() => rm(dataDir, { recursive: true, force: true }));
    let output = '';
    const child: ChildProcess = spawn(
      process.execPath,
      ['--import', 'tsx', '--conditions=svc-workspace', join(here, 'fixtures', 'scheduler-node.ts')],
      {
        cwd: root,
        env: {
          PATH: process.env.PATH,
          NODE_ENV: 'test',
          DATABASE_URL: svc.config.DATABASE_URL as string,
          REDIS_URL: svc.config.REDIS_URL as string,
          REDIS_KEY_PREFIX: svc.config.REDIS_KEY_PREFIX,
          MASTER_KEY: svc.config.MASTER_KEY as string,
          PORT: '0',
          HOST: '127.0.0.1',
          DATA_DIR: dataDir,
          MAIL_DIR: join(dataDir, 'mail'),
          LOG_LEVEL: 'silent',
          RATE_LIMIT_PER_MINUTE: '0',
          WEBHOOK_CONSUMER_SWEEP_MS: '0',
          SCHEDULER_INTERVAL_MS: '100',
          RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    t.teardown(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
    child.stdout?.on('data', (d) => {
      output += d;
    });
    child.stderr?.on('data', (d) => {
      output += d;
    });
    await until('the scheduler node is up', () => output.includes('{"ready":true}'), 60_000).catch((err) => {
      throw new Error(`${err.message}\n${output}`);
    });

    // Hold every audit write, then make the schedule due: the child claims it and fires.
    const admin = postgres(svc.config.DATABASE_URL as string, { max: 1, onnotice: () => {} });
    t.teardown(() => admin.end({ timeout: 5 }));
    const holder = await admin.reserve();
    let held = true;
    const release = async () => {
      if (!held) return;
      held = false;
      await holder`ROLLBACK`;
      holder.release();
    };
    t.teardown(release);
    await holder`BEGIN`;
    await holder`LOCK TABLE audit_events IN EXCLUSIVE MODE`;
    // A whole second, as cron slots are (the stamp compares the slot it claimed, in milliseconds).
    await svc.db.sql`
    UPDATE schedules SET next_run_at = date_trunc('second', now()) - interval '1 second' WHERE id = ${scheduleId}`;

    // Its launch commits the conversation under the claim's id; its next write, the launch's
    // audit row, waits on the lock: the child can go no further than that.
    const launched = await until(
      'the child to launch the run and stop mid-fire',
      async () => {
        const [row] = await svc.db.sql<{ claim_conversation_id: string | null; launched: boolean }[]>`
        SELECT s.claim_conversation_id,
               EXISTS (SELECT 1 FROM conversations c WHERE c.id = s.claim_conversation_id) AS launched
        FROM schedules s WHERE s.id = ${scheduleId}`;
        return row?.launched ? row.claim_conversation_id : undefined;
      },
      30_000,
    ).catch((err) => {
      throw new Error(`${err.message}\n${output}`);
    });
    // The audit write comes after the launch's commit: on a busy machine it may not have queued yet.
    const waiting = await eventually(async () => {
      const [row] = await svc.db.sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_locks WHERE relation = 'audit_events'::regclass AND NOT granted`;
      return (row?.n ?? 0) > 0;
    }, 30_000);
    t.ok(waiting, 'a write waits on the held audit table');
    t.same(await conversationsOf(), [launched], 'the child launched the run under its claim');

    child.kill('SIGKILL');
    await until('the child to die', () => child.exitCode !== null || child.signalCode !== null);
    t.equal(child.signalCode, 'SIGKILL');
    await release();
    const stamped = (await http.get(`${base}/${scheduleId}`, { token })).body;
    t.equal(stamped.last_run_at, null, 'the dead worker stamped nothing');
    t.equal((await runs()).length, 0, 'and recorded no run');

    // Another worker, once the dead one's lease has run out.
    const clock = new Date(Date.now() + NODE_LEASE_MS + 1000);
    const worker = new SchedulerWorker(
      { sql: svc.db.sql, launch: svc.launch, now: () => clock, logger: svc.log },
      { periodMs: 0, leaseMs: NODE_LEASE_MS },
    );
    t.equal(await worker.pass(), 1, 'the expired claim is taken over and fired');
    t.same(await conversationsOf(), [launched], 'no second conversation');
    const after = (await http.get(`${base}/${scheduleId}`, { token })).body;
    t.equal(after.last_conversation_id, launched, 'the dead worker’s launch is the run');
    t.equal(after.last_error, null);
    t.equal(after.last_run_at, clock.toISOString());
    const recorded = await runs();
    t.equal(recorded.length, 1, 'one run recorded');
    t.match(recorded[0], { metadata: { trigger: 'cron', conversation_id: launched } });
    t.equal(await worker.pass(), 0, 'nothing more is due');
    const turns = (await http.get(`/api/conversations/${launched}/turns`, { token })).body.data;
    t.equal(turns.length, 1, 'one turn, with the schedule’s prompt');
    t.equal(turns[0]?.prompt, 'exactly once');
  },
);
