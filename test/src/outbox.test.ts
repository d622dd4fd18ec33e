import { Writable } from 'node:stream';
import { connectionOptions, openDatabase, outbox } from '@svc/db';
import { createLogger } from '@svc/gateway';
import pino from 'pino';
import postgres from 'postgres';
import t from 'tap';
import type { LogEvent } from '../../gateway/src/log/log.ts';
import { createConversationRecord, markRead } from '../../gateway/src/services/conversations.ts';
import { changed } from '../../gateway/src/services/tenant-events.ts';
import { OutboxRelay } from '../../gateway/src/workers/outbox-relay.ts';
import { backends, signUp, startTestService, type TestService } from './harness.ts';
import { until } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The tenant's events of the given kind, waiting until there are `n` of them (or 5 s). */
async function tenantEvents(svc: TestService, tenant: string, kind: string, n: number): Promise<LogEvent[]> {
  let found: LogEvent[] = [];
  for (let i = 0; i < 100; i++) {
    found = (await svc.eventLog.read(tenant, { after: 0, limit: 10_000 })).filter((e) => e.kind === kind);
    if (found.length >= n) break;
    await sleep(50);
  }
  return found;
}

for (const backend of backends()) {
  t.test(`the outbox and its relay on ${backend}`, async (t) => {
    const svc = await startTestService(t, { backend, env: { LOG_COPY_INTERVAL_MS: '100' } });
    const { sql } = svc.db;

    t.test('a state change and its event commit together; the relay appends it as the producer outbox', async (t) => {
      const me = await signUp(svc);
      const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
      const conv = await createConversationRecord(sql, who, { agentId: 'agt_x', title: 'c' });
      const [event] = await tenantEvents(svc, me.accountId, 'conversations', 1);
      t.match(event, {
        conversationId: null,
        kind: 'conversations',
        stream: 'tenant',
        data: '{"reason":"changed"}',
        producer: 'outbox',
        seq: 1,
      });
      await markRead(sql, who, conv.id);
      await t.rejects(markRead(sql, who, 'cnv_missing'), { code: 'not_found' });
      const events = await tenantEvents(svc, me.accountId, 'conversations', 2);
      t.same(
        events.map((e) => e.seq),
        [1, 2],
        'the read is the second; the failed one wrote nothing',
      );
      // Once copied, the outbox forgets its rows; the producer's durable mark says how far.
      let left = -1;
      for (let i = 0; i < 100 && left !== 0; i++) {
        await sleep(50);
        [{ n: left }] = (await sql`SELECT count(*)::int AS n FROM log_outbox WHERE account_id = ${me.accountId}`) as [
          { n: number },
        ];
      }
      t.equal(left, 0, 'the outbox is empty once the copy holds its events');
      t.same(
        await sql`SELECT durable_seq::int AS seq FROM log_producer_marks WHERE account_id = ${me.accountId} AND producer = 'outbox'`,
        [{ seq: 2 }],
      );
    });

    t.test('a rolled-back change leaves no event and no hole in the numbering', async (t) => {
      const me = await signUp(svc);
      await t.rejects(
        sql.begin(async (tx) => {
          await outbox.enqueue(tx as never, me.accountId, [changed('team')]);
          throw new Error('the state change failed');
        }),
      );
      await sql.begin((tx) => outbox.enqueue(tx as never, me.accountId, [changed('schedule')]));
      const [event] = await tenantEvents(svc, me.accountId, 'schedule', 1);
      t.equal(event?.seq, 1, 'the next change takes number 1');
      t.same(
        (await svc.eventLog.read(me.accountId, { after: 0, limit: 100 })).map((e) => e.kind),
        ['schedule'],
        'nothing of the rolled-back one',
      );
    });

    t.test('concurrent changes commit in number order; two relays at once append each event once', async (t) => {
      const me = await signUp(svc);
      const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
      // A second relay, as another node (or this one after a restart) would run.
      const other = new OutboxRelay(
        { sql, appendEvents: svc.appendEvents, logger: createLogger('silent'), listen: true },
        { intervalMs: 20, batch: 3 },
      );
      await other.start();
      t.teardown(() => other.stop());
      await Promise.all(
        Array.from({ length: 24 }, (_, i) => createConversationRecord(sql, who, { agentId: 'agt_x', title: `c${i}` })),
      );
      const events = await tenantEvents(svc, me.accountId, 'conversations', 24);
      await sleep(300); // let both relays finish anything they might still append
      const all = (await svc.eventLog.read(me.accountId, { after: 0, limit: 1000 })).filter(
        (e) => e.kind === 'conversations',
      );
      t.equal(events.length, 24);
      t.same(
        all.map((e) => e.seq),
        Array.from({ length: 24 }, (_, i) => i + 1),
        'every number once, in id order',
      );
    });

    t.test('a database slower than the sweep interval gets one sweep at a time', async (t) => {
      // The relay on a pool of its own, sweeping every 20 ms, while another session holds
      // the outbox table: every sweep waits on the lock for 800 ms.
      const pool = svc.db.embedded
        ? postgres({ ...connectionOptions(svc.db.embedded.socketDir), max: 10, onnotice: () => {} })
        : (await openDatabase({ url: svc.config.DATABASE_URL as string, dataDir: svc.dataDir, max: 10 })).sql;
      t.teardown(() => pool.end({ timeout: 5 }));
      const relay = new OutboxRelay(
        { sql: pool, appendEvents: svc.appendEvents, logger: createLogger('silent'), listen: false },
        { intervalMs: 20, batch: 100 },
      );
      const waiting = async () =>
        Number(
          (
            await sql<{ n: string }[]>`
                SELECT count(*) AS n FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock'
                  AND query LIKE 'SELECT DISTINCT account_id FROM log_outbox%'`
          )[0]?.n,
        );
      let held = 0;
      let started: Promise<void> | undefined;
      await sql.begin(async (tx) => {
        await tx`LOCK TABLE log_outbox IN ACCESS EXCLUSIVE MODE`;
        // Not awaited here: start() awaits its first sweep, which waits for this lock.
        started = relay.start();
        await sleep(400);
        held = await waiting();
        await sleep(400);
      });
      await started;
      // This service's own relay sweeps too (one at a time as well): two at most.
      t.ok(held >= 1 && held <= 2, `sweeps waiting on the lock: ${held} (one per relay)`);
      await relay.stop();
      for (let i = 0; i < 50 && (await waiting()) > 0; i++) await sleep(20);
      t.equal(await waiting(), 0, 'none left behind once the lock is gone');
    });
  });
}

t.test('an embedded start is quiet: no failed LISTEN, the relay listens, and the outbox is relayed', async (t) => {
  const lines: { level: number; msg: string; err?: unknown }[] = [];
  const sink = new Writable({
    write(chunk, _enc, done) {
      for (const line of chunk.toString().split('\n')) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  const svc = await startTestService(t, {
    backend: 'embedded',
    env: { LOG_COPY_INTERVAL_MS: '50' },
    log: pino({ level: 'trace' }, sink),
  });
  t.equal(svc.db.kind, 'embedded');
  t.same(
    lines.filter((l) => l.err || /notification|\bLISTEN\b|EPIPE/.test(l.msg)),
    [],
    'no line about notifications or a broken pipe',
  );
  const listening = await until(
    'the relay to listen',
    async () => {
      const [row] = await svc.db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM pg_stat_activity WHERE query ILIKE 'LISTEN%'`;
      return (row?.n ?? 0) > 0 ? row?.n : undefined;
    },
    10_000,
  ).catch(() => 0);
  t.ok((listening ?? 0) >= 1, 'a session of the embedded server listens for the outbox (as on a server)');
  const me = await signUp(svc);
  await createConversationRecord(
    svc.db.sql,
    { accountId: me.accountId, actor: 'api', ip: null },
    {
      agentId: 'agt_x',
      title: 'c',
    },
  );
  const found = await tenantEvents(svc, me.accountId, 'conversations', 1);
  t.equal(found.length, 1, 'the outbox is relayed');
});
