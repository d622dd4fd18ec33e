import type { Sql } from '@svc/db';
import pino from 'pino';
import type { Test } from 'tap';
import { LogCopier } from '../workers/log-copier.ts';
import { type StageSink, WebhookConsumer, type WebhookConsumerOptions } from '../workers/webhook-consumer.ts';
import type { ConsumerGroups } from './consumer.ts';
import type { EventLog, LogEvent, NewEvent } from './log.ts';

/**
 * What every ConsumerGroups adapter must do, seen through the webhook consumer that drives it
 * (DESIGN.md "Webhook consumers"): stage events only, in id order, each acknowledged only once
 * the sink resolved; what a dead consumer held is handed out again; a trim never makes the
 * consumer skip an event. `make` gives a log and groups sharing one store; `tenant` makes an
 * account with the conversations `<tenant>-c1` and `<tenant>-c2` (the durable copy keeps only events of
 * conversations that exist), fresh per call. `loseHotState` gives a log and groups as after
 * the hot log lost everything, the Postgres copy being kept.
 */
export function consumerGroupsContract(
  t: Test,
  deps: {
    sql: Sql;
    make: () => { log: EventLog; groups: ConsumerGroups };
    tenant: () => Promise<string>;
    /** The log and groups after the hot state is lost (Redis lost its data, or a restart in memory). */
    loseHotState: (parts: {
      log: EventLog;
      groups: ConsumerGroups;
    }) => Promise<{ log: EventLog; groups: ConsumerGroups }>;
  },
) {
  const logger = pino({ level: 'silent' });
  const stage = (conversationId: string, name: string, state: string): NewEvent => ({
    conversationId,
    kind: 'stage',
    stream: 'stage',
    stage: name,
    state,
  });
  const output = (conversationId: string, data: string): NewEvent => ({
    conversationId,
    kind: 'output',
    stream: 'stdout',
    data,
  });
  /** Appends `count` events, every `every`-th a stage event, alternating conversations. */
  const burst = async (log: EventLog, tenant: string, from: number, count: number, every = 3, producer = 'p') => {
    const ids: number[] = [];
    for (let i = from; i < from + count; i++) {
      const c = `${tenant}-${i % 2 ? 'c1' : 'c2'}`;
      const e = i % every === 0 ? stage(c, 'turn', `s${i}`) : output(c, `line ${i}`);
      const r = await log.append({ tenant, producer, seq: i + 1, events: [e] });
      if (r.status !== 'appended') throw new Error(`append ${i}: ${r.status}`);
      ids.push(...r.events.map((x) => x.id));
    }
    return ids;
  };
  const stageIds = async (log: EventLog, tenant: string) =>
    (await log.read(tenant, { after: 0, limit: 100_000 })).filter((e) => e.kind === 'stage').map((e) => e.id);
  const recorder = () => {
    const calls: LogEvent[][] = [];
    const sink: StageSink = async (_tenant, events) => {
      calls.push(events);
    };
    return { calls, sink, ids: () => calls.flat().map((e) => e.id) };
  };
  const consumer = (
    parts: { log: EventLog; groups: ConsumerGroups },
    tenant: string,
    sink: StageSink,
    options: Partial<WebhookConsumerOptions> = {},
    tenants: () => string[] = () => [tenant],
    since?: number,
  ) =>
    new WebhookConsumer(
      { sql: deps.sql, ...parts, sink, tenants: async () => tenants(), since: async () => since, logger },
      { name: `c${Math.random().toString(36).slice(2, 8)}`, batch: 50, minIdleMs: 60_000, sweepMs: 0, ...options },
    );
  const until = async (what: string, check: () => boolean | Promise<boolean>) => {
    for (let waited = 0; !(await check()); waited += 20) {
      if (waited > 15_000) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  };

  t.test('the sink gets every stage event and nothing else, in id order, once, woken by the appends', async (t) => {
    const parts = deps.make();
    const tenant = await deps.tenant();
    const rec = recorder();
    const c = consumer(parts, tenant, rec.sink, { batch: 7 });
    await c.start();
    t.teardown(() => c.stop());
    await burst(parts.log, tenant, 0, 120);
    const expected = await stageIds(parts.log, tenant);
    t.equal(expected.length, 40);
    // No sweep runs (sweepMs 0): only the live feed wakes the consumer.
    await until('every stage event', () => rec.ids().length >= expected.length);
    await c.pass();
    t.same(rec.ids(), expected, 'each stage event once, in id order');
    t.ok(
      rec.calls.flat().every((e) => e.kind === 'stage' && e.stage === 'turn'),
      'no output reaches the sink',
    );
    t.equal(await parts.groups.holdFrom(tenant), (await parts.log.lastId(tenant)) + 1, 'everything acknowledged');
  });

  t.test('events stay unacknowledged until the sink resolves; a failed sink gets them again', async (t) => {
    const parts = deps.make();
    const tenant = await deps.tenant();
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    t.teardown(() => release());
    let failed = false;
    const seen: number[][] = [];
    const sink: StageSink = async (_tenant, events) => {
      seen.push(events.map((e) => e.id));
      await gate;
      if (!failed) {
        failed = true;
        throw new Error('the jobs could not be written');
      }
    };
    const c = consumer(parts, tenant, sink, { minIdleMs: 50 });
    await c.start();
    t.teardown(() => c.stop());
    await burst(parts.log, tenant, 0, 9);
    const expected = await stageIds(parts.log, tenant);
    await until('the sink is called', () => seen.length > 0);
    const first = (await parts.log.read(tenant, { after: 0, limit: 1 }))[0] as LogEvent;
    t.equal(seen[0]?.[0], first.id, 'the first batch starts with the first event');
    t.equal(await parts.groups.holdFrom(tenant), first.id, 'while the sink runs, the batch is still pending');
    release();
    await until('the sink fails', () => failed);
    await c.wake(tenant);
    t.equal(await parts.groups.holdFrom(tenant), first.id, 'a batch the sink failed is not acknowledged');
    const failedBatch = seen[0] as number[];
    await until('the failed batch is handed out again and the rest read', async () => {
      await c.pass();
      const later = seen.slice(1).flat();
      return failedBatch.every((id) => later.includes(id)) && expected.every((id) => seen.flat().includes(id));
    });
    t.same(
      [...new Set(seen.flat())].sort((x, y) => x - y),
      expected,
      'every stage event reached the sink',
    );
    t.equal(seen.flat().length, expected.length + failedBatch.length, 'only the failed batch came twice');
    t.equal(await parts.groups.holdFrom(tenant), (await parts.log.lastId(tenant)) + 1, 'then all acknowledged');
  });

  t.test('what a consumer that died held is handed to another after the idle time, once', async (t) => {
    const parts = deps.make();
    const tenant = await deps.tenant();
    const dead: number[] = [];
    // It takes its first batch and never finishes it, as a process killed mid-sink.
    const a = consumer(parts, tenant, async (_t, events) => {
      dead.push(...events.map((e) => e.id));
      await new Promise(() => {});
    });
    await a.start();
    await burst(parts.log, tenant, 0, 12);
    await until('the first consumer takes a batch', () => dead.length > 0);
    void a.stop();
    await burst(parts.log, tenant, 12, 12);
    const expected = await stageIds(parts.log, tenant);
    const rec = recorder();
    const b = consumer(parts, tenant, rec.sink, { minIdleMs: 100 });
    await b.start();
    t.teardown(() => b.stop());
    await until('every stage event reaches the second', async () => {
      await b.pass();
      return new Set(rec.ids()).size === expected.length;
    });
    const ids = rec.ids();
    t.same(
      [...ids].sort((x, y) => x - y),
      expected,
      'every stage event once',
    );
    t.ok(
      dead.every((id) => ids.includes(id)),
      'including those the dead consumer held',
    );
    t.equal(await parts.groups.holdFrom(tenant), (await parts.log.lastId(tenant)) + 1, 'all acknowledged');
  });

  t.test('the trim keeps what the group has not acknowledged', async (t) => {
    const parts = deps.make();
    const tenant = await deps.tenant();
    const rec = recorder();
    const c = consumer(parts, tenant, rec.sink);
    await c.start();
    await burst(parts.log, tenant, 0, 30);
    await until(
      'the first events are consumed',
      async () => rec.ids().length === (await stageIds(parts.log, tenant)).length,
    );
    await c.stop();
    const unread = await burst(parts.log, tenant, 30, 120);
    const copier = new LogCopier(
      { sql: deps.sql, log: parts.log, logger, holds: (ten) => parts.groups.holdFrom(ten) },
      { intervalMs: 1000, batch: 40, keepHot: 20, maxHeld: 10_000 },
    );
    t.equal(await copier.copyTenant(tenant), 150);
    const hold = (await parts.groups.holdFrom(tenant)) as number;
    t.ok((await parts.log.floor(tenant)) > 0, 'the tail was trimmed');
    t.ok((await parts.log.floor(tenant)) <= hold, 'but not past what the group still needs');
    t.ok(hold <= (unread[0] as number), 'the group needs the events appended since it stopped');
    const hot = await parts.log.read(tenant, { after: hold - 1, limit: 1000 });
    t.same(
      hot.map((e) => e.id),
      unread,
      'which the hot log still holds, all of them',
    );
  });

  t.test('a group that fell behind the trim point reads the durable copy and skips nothing', async (t) => {
    const parts = deps.make();
    const tenant = await deps.tenant();
    const rec = recorder();
    const c1 = consumer(parts, tenant, rec.sink);
    await c1.start();
    await burst(parts.log, tenant, 0, 30, 5);
    await until(
      'the first events are consumed',
      async () => rec.ids().length === (await stageIds(parts.log, tenant)).length,
    );
    await c1.stop();
    await burst(parts.log, tenant, 30, 270, 5);
    const expected = await stageIds(parts.log, tenant);
    // The hold gives way past 50 events: the group's position ends far below the trim point.
    const copier = new LogCopier(
      { sql: deps.sql, log: parts.log, logger, holds: (ten) => parts.groups.holdFrom(ten) },
      { intervalMs: 1000, batch: 100, keepHot: 20, maxHeld: 50 },
    );
    await copier.copyTenant(tenant);
    const floor = await parts.log.floor(tenant);
    t.ok(floor > ((await parts.groups.holdFrom(tenant)) as number) + 100, 'the trim passed the group');
    const c2 = consumer(parts, tenant, rec.sink, { batch: 16 });
    await c2.start();
    t.teardown(() => c2.stop());
    await until('every stage event', () => rec.ids().length >= expected.length);
    await c2.pass();
    t.same(rec.ids(), expected, 'every stage event once, in id order, across the durable copy and the hot log');
  });

  t.test('a group lost with the hot log resumes from its recorded mark, skipping nothing copied', async (t) => {
    const parts = deps.make();
    const tenant = await deps.tenant();
    const rec = recorder();
    const c1 = consumer(parts, tenant, rec.sink);
    await c1.start();
    await burst(parts.log, tenant, 0, 30);
    await until(
      'the first events are consumed',
      async () => rec.ids().length === (await stageIds(parts.log, tenant)).length,
    );
    await c1.pass(); // the sweep records how far the group got
    await c1.stop();
    const consumed = rec.ids();
    await burst(parts.log, tenant, 30, 30);
    const copier = new LogCopier(
      { sql: deps.sql, log: parts.log, logger },
      { intervalMs: 1000, batch: 100, keepHot: 1000 },
    );
    t.equal(await copier.copyTenant(tenant), 60);
    const unconsumed = (await stageIds(parts.log, tenant)).filter((id) => !consumed.includes(id));
    t.equal(unconsumed.length, 10);

    const after = await deps.loseHotState(parts);
    t.equal(await after.log.lastId(tenant), 0, 'the hot log is empty');
    const later = (await burst(after.log, tenant, 0, 9, 3, 'q')).filter((_, i) => i % 3 === 0);
    const rec2 = recorder();
    const c2 = consumer(after, tenant, rec2.sink, { batch: 7 });
    await c2.start();
    t.teardown(() => c2.stop());
    await until('the rest', () => rec2.ids().length >= unconsumed.length + later.length);
    await c2.pass();
    t.same(
      rec2.ids(),
      [...unconsumed, ...later],
      'what was not consumed, from the copy, then the new events, once each',
    );
  });

  t.test('a tenant that leaves the list loses its group, also one left by a consumer that is gone', async (t) => {
    const parts = deps.make();
    const watched = await deps.tenant();
    const orphan = await deps.tenant();
    const gone = consumer(parts, orphan, recorder().sink);
    await gone.start();
    await gone.stop();
    t.type(await parts.groups.holdFrom(orphan), 'number', 'a consumer that stopped left a group behind');
    let list = [watched];
    const c = consumer(parts, watched, recorder().sink, {}, () => list);
    await c.start();
    t.teardown(() => c.stop());
    t.equal(await parts.groups.holdFrom(orphan), undefined, 'the group nobody lists any more is removed');
    t.type(await parts.groups.holdFrom(watched), 'number', 'the listed tenant has a group');
    list = [];
    await c.pass();
    t.equal(await parts.groups.holdFrom(watched), undefined, 'and loses it when it leaves the list');
    const rec = recorder();
    list = [watched];
    const c2 = consumer(parts, watched, rec.sink, {}, () => list);
    await burst(parts.log, watched, 0, 3);
    await c2.start();
    t.teardown(() => c2.stop());
    const later = (await burst(parts.log, watched, 3, 3)).slice(0, 1);
    await until('the event after it came back', () => rec.ids().length >= 1);
    await c2.pass();
    t.same(rec.ids(), later, 'back on the list, it starts at the events appended from then on');
  });

  t.test('a tenant seen for the first time is consumed from when its endpoints exist', async (t) => {
    const parts = deps.make();
    const tenant = await deps.tenant();
    await burst(parts.log, tenant, 0, 6);
    await new Promise((r) => setTimeout(r, 5));
    const since = Date.now();
    await new Promise((r) => setTimeout(r, 5));
    const after = (await burst(parts.log, tenant, 6, 6)).filter((_, i) => i % 3 === 0);
    const rec = recorder();
    const c = consumer(parts, tenant, rec.sink, {}, undefined, since);
    await c.start();
    t.teardown(() => c.stop());
    await until('the events appended since then', () => rec.ids().length >= after.length);
    await c.pass();
    t.same(rec.ids(), after, 'the stage events appended since then, not those before');
  });
}
