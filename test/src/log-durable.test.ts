import { conversations, logEvents, type Sql } from '@svc/db';
import { createLogger } from '@svc/gateway';
import { Redis } from 'ioredis';
import t from 'tap';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { logKeys, redisEventLog } from '../../gateway/src/log/log.redis.ts';
import type { EventLog } from '../../gateway/src/log/log.ts';
import { readLog } from '../../gateway/src/log/read.ts';
import { LogCopier } from '../../gateway/src/workers/log-copier.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { until } from './until.ts';

const out = (conversationId: string, data: string) => ({ conversationId, kind: 'output', stream: 'stdout', data });

/** The copy keeps only events of conversations that exist: make the ones a test writes to. */
const haveConversations = (sql: Sql, accountId: string, ...ids: string[]) =>
  Promise.all(
    ids.map((id) =>
      conversations.insertConversation(sql, { id, accountId, agentId: 'agt_x', title: '', source: 'ui' }),
    ),
  );

for (const backend of backends()) {
  t.test(`the durable copy on ${backend}`, async (t) => {
    const svc = await startTestService(t, { backend });
    const { sql } = svc.db;
    const logger = createLogger('silent');
    let redis: Redis | undefined;
    let sub: Redis | undefined;
    let prefix = '';
    const makeLog = (): EventLog => {
      if (backend === 'postgres+redis') {
        redis = new Redis(process.env.TEST_REDIS_URL as string);
        sub = new Redis(process.env.TEST_REDIS_URL as string);
        prefix = `durable${Math.random().toString(36).slice(2, 6)}:`;
        return redisEventLog(redis, sub, { prefix });
      }
      return memoryEventLog();
    };
    const log = makeLog();
    t.teardown(async () => {
      await redis?.quit();
      await sub?.quit();
    });
    const { accountId: tenant } = await signUp(svc);
    await haveConversations(sql, tenant, 'a', 'b');
    let seq = 0;
    for (let i = 0; i < 35; i++)
      await log.append({ tenant, producer: 'p', seq: ++seq, events: [out(i % 2 ? 'a' : 'b', `line ${i}`)] });
    const all = await log.read(tenant, { after: 0, limit: 100 });

    t.test('copies every event once, in batches, and records how far it got', async (t) => {
      const copier = new LogCopier({ sql, log, logger }, { intervalMs: 1000, batch: 10, keepHot: 1000 });
      const durable: [string, number][] = [];
      copier.onDurable((ten, marks) => {
        if (ten === tenant) durable.push(...marks);
      });
      t.type(await copier.lag(tenant), 'number', 'lag is the age of the oldest uncopied event');
      t.equal(await copier.copyTenant(tenant), 35);
      t.equal(await copier.lag(tenant), null, 'nothing left to copy');
      t.same(durable.at(-1), ['p', 35], 'the producer is told its events up to 35 are durable');
      t.same(
        await sql`SELECT producer, durable_seq::int AS seq FROM log_producer_marks WHERE account_id = ${tenant}`,
        [{ producer: 'p', seq: 35 }],
        'and its durable mark is stored with them',
      );
      const rows = await sql<{ n: number; max: string }[]>`
        SELECT count(*)::int AS n, max(id)::text AS max FROM log_events WHERE account_id = ${tenant}`;
      t.equal(rows[0]?.n, 35);
      t.equal(Number(rows[0]?.max), all.at(-1)?.id);
    });

    t.test('after a crash a new copier resumes from the mark; a batch copied twice is stored once', async (t) => {
      for (let i = 35; i < 60; i++)
        await log.append({ tenant, producer: 'p', seq: ++seq, events: [out('a', `line ${i}`)] });
      // Copied twice: the mark goes back as if the commit of a batch had been lost after its rows.
      await sql`UPDATE log_copy_marks SET copied_id = ${all[20]?.id as number} WHERE account_id = ${tenant}`;
      const restarted = new LogCopier({ sql, log, logger }, { intervalMs: 1000, batch: 7, keepHot: 1000 });
      await restarted.start();
      await restarted.pass();
      await restarted.stop();
      const rows = await sql<{ n: number; distinct_ids: number }[]>`
        SELECT count(*)::int AS n, count(DISTINCT id)::int AS distinct_ids FROM log_events WHERE account_id = ${tenant}`;
      t.same(rows[0], { n: 60, distinct_ids: 60 });
    });

    t.test('reads reach below the hot tail into Postgres without a hole', async (t) => {
      const mark = Number(
        (await sql<{ c: string }[]>`SELECT copied_id::text AS c FROM log_copy_marks WHERE account_id = ${tenant}`)[0]
          ?.c,
      );
      // Trim the hot tail below the mark, as trimming does.
      const hot: EventLog =
        backend === 'postgres+redis'
          ? log
          : { ...log, read: async (ten, o) => (await log.read(ten, o)).filter((e) => e.id > mark - 10) };
      if (redis) {
        const keys = logKeys(prefix, tenant);
        await redis.xtrim(keys.log, 'MINID', `${mark - 10}`);
        await redis.xtrim(keys.conversation('a'), 'MINID', `${mark - 10}`);
        await redis.xtrim(keys.conversation('b'), 'MINID', `${mark - 10}`);
      }
      const trimmedHot = await hot.read(tenant, { after: 0, limit: 1000 });
      t.ok(trimmedHot.length < 60, `the hot tail now holds ${trimmedHot.length}`);
      const read = await readLog({ sql, log: hot }, tenant, { after: 0, limit: 1000 });
      const ids = read.map((e) => e.id);
      t.equal(ids.length, 60, 'all 60');
      t.ok(
        ids.every((id, i) => i === 0 || id > (ids[i - 1] as number)),
        'in order, once each',
      );
      const paged: number[] = [];
      let after = 0;
      for (;;) {
        const page = await readLog({ sql, log: hot }, tenant, { after, limit: 9 });
        if (page.length === 0) break;
        paged.push(...page.map((e) => e.id));
        after = page.at(-1)?.id as number;
      }
      t.same(paged, ids, 'paging across the boundary gives the same events');
      const b = await readLog({ sql, log: hot }, tenant, { after: 0, limit: 1000, conversationId: 'b' });
      t.equal(b.length, 18, "one conversation's events only");
      t.same(
        read.slice(0, 3).map((e) => e.data),
        ['line 0', 'line 1', 'line 2'],
        'events come back as appended',
      );
    });

    t.test('a producer mark the hot log lost is loaded from the copy: a durable resend stays a no-op', async (t) => {
      const { accountId: ten } = await signUp(svc);
      await haveConversations(sql, ten, 'm');
      const loadMark = (tenant: string, producer: string) => logEvents.durableMark(sql, tenant, producer);
      const withMarks = (): EventLog =>
        redis ? redisEventLog(redis, sub as Redis, { prefix, loadMark }) : memoryEventLog({ loadMark });
      const first = withMarks();
      const batch = (from: number, n: number) =>
        Array.from({ length: n }, (_, i) => out('m', `event ${from + i}`)) as ReturnType<typeof out>[];
      t.equal(
        (await first.append({ tenant: ten, producer: 'runner:r1', seq: 1, events: batch(1, 5) })).status,
        'appended',
      );
      const copier = new LogCopier({ sql, log: first, logger }, { intervalMs: 1000, batch: 100, keepHot: 1000 });
      t.equal(await copier.copyTenant(ten), 5);
      // The hot log loses its data: Redis keys deleted, or a new process's memory.
      let again = first;
      if (redis) {
        const keys = logKeys(prefix, ten);
        await redis.del(keys.producer('runner:r1'), keys.seq, keys.log, keys.conversation('m'));
      } else {
        again = withMarks();
      }
      const resend = await again.append({ tenant: ten, producer: 'runner:r1', seq: 3, events: batch(3, 3) });
      t.same(
        { status: resend.status, hwm: resend.hwm },
        { status: 'duplicate', hwm: 5 },
        'durable events are not taken twice',
      );
      const gap = await again.append({ tenant: ten, producer: 'runner:r1', seq: 8, events: batch(8, 1) });
      t.equal(gap.status, 'gap', 'the loaded mark still detects a jump');
      const next = await again.append({ tenant: ten, producer: 'runner:r1', seq: 5, events: batch(5, 3) });
      t.same(
        next.events.map((e) => [e.seq, e.data]),
        [
          [6, 'event 6'],
          [7, 'event 7'],
        ],
        'an overlap appends only what is new',
      );
      const fresh = await again.append({ tenant: ten, producer: 'runner:new', seq: 40, events: batch(40, 1) });
      t.equal(fresh.status, 'appended', 'a producer the copy never saw starts where it says');
      // A new producer keeps several appends in flight; each finds no mark, and all must land
      // in the order sent (their mark loads are shared, so their retries keep that order).
      const inFlight = await Promise.all([
        again.append({ tenant: ten, producer: 'runner:busy', seq: 1, events: batch(1, 1) }),
        again.append({ tenant: ten, producer: 'runner:busy', seq: 2, events: batch(2, 4) }),
        again.append({ tenant: ten, producer: 'runner:busy', seq: 6, events: batch(6, 1) }),
        again.append({ tenant: ten, producer: 'runner:busy', seq: 7, events: batch(7, 3) }),
      ]);
      t.same(
        inFlight.map((r) => [r.status, r.hwm]),
        [
          ['appended', 1],
          ['appended', 5],
          ['appended', 6],
          ['appended', 9],
        ],
        'appends in flight together all land, in order',
      );
      if (!redis) return;
      // Their answers may come back apart: here a BLPOP on the log's connection holds the
      // answers of the appends sent after it until the first append has loaded its mark and
      // sent its retry. The producer's next append, made when the first is answered, must
      // still run after the retries of the two before it (it used to run first: a gap).
      const conn = new Redis(process.env.TEST_REDIS_URL as string);
      const connSub = new Redis(process.env.TEST_REDIS_URL as string);
      t.teardown(async () => {
        await conn.quit();
        await connSub.quit();
      });
      // An append made during the load, while the two before it are still unanswered, goes
      // after their retries too.
      let loads = 0;
      let split: EventLog | undefined;
      let duringLoad: ReturnType<EventLog['append']> | undefined;
      const slowLoad = async (tenant: string, producer: string) => {
        loads++;
        await new Promise((r) => setTimeout(r, 10));
        duringLoad ??= split?.append({ tenant: ten, producer: 'runner:split', seq: 5, events: batch(5, 1) });
        await new Promise((r) => setTimeout(r, 20));
        return logEvents.durableMark(sql, tenant, producer);
      };
      split = redisEventLog(conn, connSub, { prefix, loadMark: slowLoad });
      const a1 = split.append({ tenant: ten, producer: 'runner:split', seq: 1, events: batch(1, 1) });
      const held = conn.blpop(`${prefix}nothing`, 0.3);
      const a2 = split.append({ tenant: ten, producer: 'runner:split', seq: 2, events: batch(2, 2) });
      const a3 = split.append({ tenant: ten, producer: 'runner:split', seq: 4, events: batch(4, 1) });
      const one = await a1;
      const a4 = split.append({ tenant: ten, producer: 'runner:split', seq: 6, events: batch(6, 3) });
      const rest = await Promise.all([a2, a3, duringLoad, a4]);
      t.equal(await held, null, 'the BLPOP held the connection');
      t.same(
        [one, ...rest].map((r) => [r?.status, r?.hwm]),
        [
          ['appended', 1],
          ['appended', 3],
          ['appended', 4],
          ['appended', 5],
          ['appended', 8],
        ],
        'answers split by a load still land in the order made',
      );
      t.equal(loads, 1, 'one load of the mark');
      const landed = await split.read(ten, { after: 0, limit: 1000 });
      t.same(
        landed.filter((e) => e.producer === 'runner:split').map((e) => e.seq),
        [1, 2, 3, 4, 5, 6, 7, 8],
        "the log holds the producer's events once each, in order",
      );
    });

    t.test('a stored batch keeps every field; not a gone conversation or a tenant placeholder', async (t) => {
      const { accountId: ten } = await signUp(svc);
      await haveConversations(sql, ten, 'kept');
      const base = { turnId: null, data: null, stage: null, state: null, durationMs: null, ts: '' };
      const events = [
        {
          ...base,
          id: 1_700_000_000_000_001,
          conversationId: 'kept',
          turnId: 'trn_1',
          kind: 'output',
          stream: 'stdout',
          data: 'quotes " and \\ and ünïcödé ✓\nnew line',
          ts: '2026-11-23T10:00:00.123Z',
          producer: 'runner:a',
          seq: 4,
        },
        {
          ...base,
          id: 1_700_000_000_000_002,
          conversationId: 'kept',
          kind: 'stage',
          stream: 'stage',
          stage: 'clone',
          state: 'done',
          durationMs: 1234,
          ts: '2026-11-23T10:00:01.000Z',
          producer: 'runner:a',
          seq: 5,
        },
        {
          ...base,
          id: 1_700_000_000_000_003,
          conversationId: 'gone',
          kind: 'output',
          stream: 'stdout',
          data: 'x',
          ts: '2026-11-23T10:00:02.000Z',
          producer: 'runner:b',
          seq: 9,
        },
        {
          ...base,
          id: 1_700_000_000_000_004,
          conversationId: null,
          kind: 'dropped',
          stream: 'conversations',
          ts: '2026-11-23T10:00:03.000Z',
          producer: 'api',
          seq: 2,
        },
        {
          ...base,
          id: 1_700_000_000_000_005,
          conversationId: null,
          kind: 'conversation.created',
          stream: 'conversations',
          data: '{"id":"kept"}',
          ts: '2026-11-23T10:00:04.000Z',
          producer: 'api',
          seq: 3,
        },
      ];
      const marks = await logEvents.storeBatch(sql, ten, events);
      t.same(
        [...marks],
        [
          ['runner:a', 5],
          ['runner:b', 9],
          ['api', 3],
        ],
        "every producer's highest number, stored or not",
      );
      const stored = await logEvents.readStored(sql, ten, { after: 0, upTo: Number.MAX_SAFE_INTEGER, limit: 10 });
      t.same(
        stored,
        [events[0], events[1], events[4]],
        'the live conversation and the tenant event, field for field; not the gone one or the placeholder',
      );
      const durable = await sql<{ producer: string; durable_seq: string }[]>`
        SELECT producer, durable_seq FROM log_producer_marks WHERE account_id = ${ten} ORDER BY producer`;
      t.same(
        durable.map((r) => [r.producer, Number(r.durable_seq)]),
        [
          ['api', 3],
          ['runner:a', 5],
          ['runner:b', 9],
        ],
      );
      t.equal(await logEvents.copiedUpTo(sql, ten), 1_700_000_000_000_005, 'the mark is the last id of the batch');
      await logEvents.storeBatch(sql, ten, events.slice(0, 2));
      t.equal(await logEvents.copiedUpTo(sql, ten), 1_700_000_000_000_005, 'a batch stored again moves no mark back');
      t.equal(
        (await logEvents.readStored(sql, ten, { after: 0, upTo: Number.MAX_SAFE_INTEGER, limit: 10 })).length,
        3,
        'and is stored once',
      );
    });

    t.test('a NUL in an event is stored as U+FFFD, hot and durable alike, and the copy goes on', async (t) => {
      const { accountId: ten } = await signUp(svc);
      await haveConversations(sql, ten, 'n');
      const [appended] = (
        await log.append({
          tenant: ten,
          producer: 'p',
          seq: 1,
          events: [{ ...out('n', 'binary\u0000output'), turnId: 'trn\u0000x', stage: 'a\u0000', state: '\u0000' }],
        })
      ).events;
      await log.append({ tenant: ten, producer: 'p', seq: 2, events: [out('n', 'after it')] });
      const want = { data: 'binary\uFFFDoutput', turnId: 'trn\uFFFDx', stage: 'a\uFFFD', state: '\uFFFD' };
      t.match(appended, want, 'the append answers what it stored');
      t.match((await log.read(ten, { after: 0, limit: 10 }))[0], want, 'the hot log holds it so');
      const copier = new LogCopier({ sql, log, logger }, { intervalMs: 1000, batch: 100, keepHot: 1000 });
      t.equal(await copier.copyTenant(ten), 2, 'both events copied (Postgres text cannot hold a NUL)');
      const stored = await logEvents.readStored(sql, ten, { after: 0, upTo: Number.MAX_SAFE_INTEGER, limit: 10 });
      t.match(stored[0], want, 'the durable copy holds the same text');
      t.equal(stored[1]?.data, 'after it');
    });

    t.test('a read racing a copy and a trim finds no hole', async (t) => {
      const { accountId: ten } = await signUp(svc);
      await haveConversations(sql, ten, 'r');
      for (let i = 0; i < 30; i++)
        await log.append({ tenant: ten, producer: 'p', seq: i + 1, events: [out('r', `r${i}`)] });
      const events = await log.read(ten, { after: 0, limit: 100 });
      await logEvents.storeBatch(sql, ten, events.slice(0, 10));
      // The reader has read the mark (after event 10); before it reads the hot log, the copier
      // copies the rest and trims all but the newest 5.
      let raced = false;
      const racing: EventLog = {
        ...log,
        read: async (tenant, o) => {
          if (!raced && tenant === ten) {
            raced = true;
            await logEvents.storeBatch(sql, ten, events.slice(10));
            await log.trim(ten, { upTo: (events.at(-1) as { id: number }).id, keep: 5 });
          }
          return log.read(tenant, o);
        },
      };
      const read = await readLog({ sql, log: racing }, ten, { after: 0, limit: 100 });
      t.ok(raced, 'the trim ran inside the read');
      t.same(
        read.map((e) => e.data),
        events.map((e) => e.data),
        'all 30, in order, once each',
      );
    });

    t.test(
      'a read after an id the hot log holds asks nothing of Postgres; after one it dropped, it reaches below',
      async (t) => {
        const { accountId: ten } = await signUp(svc);
        await haveConversations(sql, ten, 'h');
        for (let i = 0; i < 20; i++)
          await log.append({ tenant: ten, producer: 'p', seq: i + 1, events: [out('h', `h${i}`)] });
        const events = await log.read(ten, { after: 0, limit: 100 });
        await logEvents.storeBatch(sql, ten, events);
        await log.trim(ten, { upTo: (events.at(-1) as { id: number }).id, keep: 5 });
        t.equal((await log.read(ten, { after: 0, limit: 100 })).length, 5, 'the hot log keeps the newest 5');
        let asked = 0;
        const counting = new Proxy(sql, {
          apply: (f, self, args) => {
            asked++;
            return Reflect.apply(f, self, args);
          },
        });
        const id = (i: number) => (events[i] as { id: number }).id;
        const texts = (from: number) => events.slice(from).map((e) => e.data);
        const held = await readLog({ sql: counting, log }, ten, { after: id(16), limit: 100 });
        t.same(
          held.map((e) => e.data),
          texts(17),
        );
        const heldOfConversation = await readLog({ sql: counting, log }, ten, {
          after: id(15),
          limit: 2,
          conversationId: 'h',
        });
        t.same(
          heldOfConversation.map((e) => e.data),
          ['h16', 'h17'],
          'a page of a conversation too',
        );
        t.equal(asked, 0, 'Postgres was not asked');
        const dropped = await readLog({ sql: counting, log }, ten, { after: id(5), limit: 100 });
        t.same(
          dropped.map((e) => e.data),
          texts(6),
          'from an id the hot log dropped, the whole rest',
        );
        t.ok(asked > 0, 'part of it from Postgres');
      },
    );

    t.test('the copier trims the hot tail to its size, never above the copy mark', async (t) => {
      for (let i = 60; i < 80; i++)
        await log.append({ tenant, producer: 'p', seq: ++seq, events: [out('a', `line ${i}`)] });
      const copier = new LogCopier({ sql, log, logger }, { intervalMs: 1000, batch: 100, keepHot: 5 });
      t.equal(await copier.copyTenant(tenant), 20);
      const hot = await log.read(tenant, { after: 0, limit: 1000 });
      t.equal(hot.length, 5, 'the hot tail keeps the newest 5');
      const everything = await readLog({ sql, log }, tenant, { after: 0, limit: 1000 });
      t.equal(everything.length, 80, 'nothing is lost: the rest comes from Postgres');
      await log.append({ tenant, producer: 'p', seq: ++seq, events: [out('a', 'after trim')] });
      const tail = await readLog({ sql, log }, tenant, { after: everything.at(-1)?.id as number, limit: 10 });
      t.same(
        tail.map((e) => e.data),
        ['after trim'],
        'appends continue above the trimmed tail',
      );
    });
    t.test('the hot tail is cut back to its size only once it has grown a tenth past it', async (t) => {
      const { accountId: ten } = await signUp(svc);
      await haveConversations(sql, ten, 's');
      let n = 0;
      const appendUpTo = async (count: number) => {
        while (n < count) await log.append({ tenant: ten, producer: 'p', seq: ++n, events: [out('s', `s${n}`)] });
      };
      const hot = async () => (await log.read(ten, { after: 0, limit: 1000 })).map((e) => e.data);
      const newestId = async () => (await log.read(ten, { after: 0, limit: 1000 })).at(-1)?.id as number;
      await appendUpTo(22);
      await log.trim(ten, { upTo: await newestId(), keep: 20 });
      t.equal((await hot()).length, 22, 'within the slack (20 + 2): nothing is trimmed');
      t.equal(await log.floor(ten), 0, 'and the trim point did not move');
      await appendUpTo(23);
      const copied = await newestId();
      await log.trim(ten, { upTo: copied, keep: 20 });
      t.same(
        await hot(),
        Array.from({ length: 20 }, (_, i) => `s${i + 4}`),
        'past it: the newest 20 stay, in order',
      );
      await appendUpTo(50);
      await log.trim(ten, { upTo: copied, keep: 20 });
      const capped = await hot();
      t.equal(capped[0], 's24', 'never above the copy mark: what is above it stays, however much');
      t.equal(capped.length, 27);
    });

    t.test('a tenant whose copy fails is retried by the next pass; the others are copied meanwhile', async (t) => {
      const { accountId: broken } = await signUp(svc);
      const { accountId: fine } = await signUp(svc);
      await haveConversations(sql, broken, 'x');
      await haveConversations(sql, fine, 'y');
      await log.append({ tenant: broken, producer: 'p', seq: 1, events: [out('x', 'kept for later')] });
      await log.append({ tenant: fine, producer: 'p', seq: 1, events: [out('y', 'copied now')] });
      // The hot log refuses the first read of one tenant, as an unreachable Redis would.
      let refuse = true;
      const flaky = new Proxy(log, {
        get(target, key) {
          if (key === 'read') {
            return async (ten: string, o: Parameters<EventLog['read']>[1]) => {
              if (ten === broken && refuse) {
                refuse = false;
                throw new Error('hot log unreachable');
              }
              return target.read(ten, o);
            };
          }
          const value = Reflect.get(target, key, target);
          return typeof value === 'function' ? value.bind(target) : value;
        },
      });
      const stored = async (ten: string) =>
        (await sql<{ data: string }[]>`SELECT data FROM log_events WHERE account_id = ${ten}`).map((r) => r.data);
      const copier = new LogCopier({ sql, log: flaky, logger }, { intervalMs: 60_000, batch: 10, keepHot: 1000 });
      copier.track(broken);
      copier.track(fine);
      await copier.pass();
      t.same(await stored(fine), ['copied now'], 'the failure did not stop the pass');
      t.same(await stored(broken), [], 'the failed tenant has nothing copied yet');
      await copier.pass();
      t.same(await stored(broken), ['kept for later'], 'the next pass copies it');
    });

    // Two transactions at once, on two of the pool's connections.
    t.test('a conversation deleted while a copy writes its events keeps none of them', async (t) => {
      const { accountId: ten } = await signUp(svc);
      const event = (id: number, conversationId: string) => ({
        id,
        conversationId,
        turnId: null,
        kind: 'output',
        stream: 'stdout',
        data: `in ${conversationId}`,
        stage: null,
        state: null,
        durationMs: null,
        ts: '2026-11-27T10:00:00.000Z',
        producer: 'p',
        seq: id,
      });
      const stored = async () =>
        (
          await sql<{ conversation_id: string }[]>`
            SELECT conversation_id FROM log_events WHERE account_id = ${ten} ORDER BY id`
        ).map((r) => r.conversation_id);
      // Advisory locks held (or waited for) in the test's database, by mode.
      const advisory = async (granted: boolean, mode: string) =>
        (
          await sql`
            SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted = ${granted} AND mode = ${mode}
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
        ).length > 0;
      const release = () => {
        let open = () => {};
        const gate = new Promise<void>((resolve) => {
          open = resolve;
        });
        return { gate, open };
      };

      // The copy first: its transaction holds the lock; the delete waits, then removes its rows.
      await haveConversations(sql, ten, 'first', 'other');
      const copyHeld = release();
      const copying = sql.begin(async (tx) => {
        await logEvents.storeBatch(tx as unknown as Sql, ten, [event(1, 'first'), event(2, 'other')]);
        await copyHeld.gate;
      });
      await until('the copy to hold the lock', () => advisory(true, 'ShareLock'));
      let deleted: boolean | undefined;
      const deleting = conversations.deleteConversation(sql, ten, 'first').then((d) => {
        deleted = d;
      });
      await until('the delete to wait for the lock', () => advisory(false, 'ExclusiveLock'));
      t.equal(deleted, undefined, 'the delete waits for the copy under way');
      copyHeld.open();
      await copying;
      await deleting;
      t.equal(deleted, true);
      t.same(await stored(), ['other'], "the copy's rows of the deleted conversation went with it");

      // The delete first: the copy waits, then sees the conversation gone and stores nothing of it.
      await haveConversations(sql, ten, 'second');
      const deleteHeld = release();
      const deleting2 = sql.begin(async (tx) => {
        await conversations.deleteConversation(tx as unknown as Sql, ten, 'second');
        await deleteHeld.gate;
      });
      await until('the delete to hold the lock', () => advisory(true, 'ExclusiveLock'));
      let copied: Map<string, number> | undefined;
      const copying2 = logEvents.storeBatch(sql, ten, [event(3, 'second'), event(4, 'other')]).then((m) => {
        copied = m;
      });
      await until('the copy to wait for the lock', () => advisory(false, 'ShareLock'));
      t.equal(copied, undefined, 'the copy waits for the delete under way');
      deleteHeld.open();
      await deleting2;
      await copying2;
      t.same([...(copied ?? [])], [['p', 4]], 'the copy completes, its producer mark moved');
      t.same(await stored(), ['other', 'other'], 'and nothing of the conversation deleted before it was stored');
    });
  });
}

t.test('the running service copies what its write path appends, redacted, within about a second', async (t) => {
  const svc = await startTestService(t);
  const { accountId } = await signUp(svc);
  await haveConversations(svc.db.sql, accountId, 'conv1');
  await svc.redaction.register(accountId, 'conv1', ['ghp_secretvalue123456']);
  const result = await svc.appendEvents({
    tenant: accountId,
    producer: 'runner:x',
    seq: 1,
    events: [
      { conversationId: 'conv1', kind: 'output', stream: 'stdout', data: 'cloning with ghp_secretvalue123456\n' },
      { conversationId: 'conv1', kind: 'stage', stream: 'stage', stage: 'turn', state: 'done', durationMs: 1200 },
    ],
  });
  t.equal(result.status, 'appended');
  let rows: { data: string | null; stage: string | null }[] = [];
  for (let i = 0; i < 100 && rows.length < 2; i++) {
    await new Promise((r) => setTimeout(r, 50));
    rows = await svc.db.sql`SELECT data, stage FROM log_events WHERE account_id = ${accountId} ORDER BY id`;
  }
  t.equal(rows.length, 2, 'both events are in Postgres');
  t.equal(rows[0]?.data, 'cloning with [REDACTED]\n');
  t.equal(rows[1]?.stage, 'turn');
});
