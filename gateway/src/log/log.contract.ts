import type { Test } from 'tap';
import { follow } from './follow.ts';
import type { EventLog, LogEvent, NewEvent } from './log.ts';

/**
 * What every EventLog adapter must do (DESIGN.md "The event log", invariants 1, 3 and 4 at the
 * port; redaction and the Postgres copy sit above it). `make` gives a fresh log; tenants are
 * unique per run so adapters sharing a store do not interfere.
 */
export function eventLogContract(
  t: Test,
  make: () => Promise<EventLog> | EventLog,
  options: { loseData?: () => Promise<void> } = {},
) {
  const run = Math.random().toString(36).slice(2, 8);
  let n = 0;
  const tenant = () => `t${run}${++n}`;
  const out = (conversationId: string, data: string): NewEvent => ({
    conversationId,
    kind: 'output',
    stream: 'stdout',
    data,
  });
  /**
   * Appends `count` events at a time, one per call, as one producer numbering from 1; each
   * event's data is `prefix` and its number.
   */
  const producer = (log: EventLog, ten: string, id: string, conversationId: string, prefix = '') => {
    let seq = 0;
    return async (count: number) => {
      for (let i = 0; i < count; i++) {
        await log.append({ tenant: ten, producer: id, seq: ++seq, events: [out(conversationId, `${prefix}${seq}`)] });
      }
    };
  };

  t.test('ids are integers, strictly increasing within a tenant across conversations', async (t) => {
    const log = await make();
    const ten = tenant();
    const ids: number[] = [];
    for (let i = 0; i < 20; i++) {
      const r = await log.append({
        tenant: ten,
        producer: `p${i % 3}`,
        seq: Math.floor(i / 3),
        events: [out(`c${i % 2}`, `x${i}`)],
      });
      t.equal(r.status, 'appended');
      ids.push(...r.events.map((e) => e.id));
    }
    t.ok(
      ids.every((id) => Number.isSafeInteger(id)),
      'safe integers',
    );
    t.ok(
      ids.every((id, i) => i === 0 || id > (ids[i - 1] as number)),
      'strictly increasing',
    );
    t.equal(await log.lastId(ten), ids.at(-1));
    const all = await log.read(ten, { after: 0, limit: 100 });
    t.same(
      all.map((e) => e.id),
      ids,
      'read returns them oldest first',
    );
    const c1 = await log.read(ten, { after: 0, limit: 100, conversationId: 'c1' });
    t.ok(c1.length === 10 && c1.every((e) => e.conversationId === 'c1'), 'per conversation');
    const page = await log.read(ten, { after: ids[4] as number, limit: 3 });
    t.same(
      page.map((e) => e.id),
      ids.slice(5, 8),
      'after is exclusive, limit bounds',
    );
  });

  t.test('a resend is a no-op, an overlap appends only the new part, a jump is a gap', async (t) => {
    const log = await make();
    const ten = tenant();
    const first = await log.append({
      tenant: ten,
      producer: 'runner-1',
      seq: 1,
      events: [out('c', 'a'), out('c', 'b')],
    });
    t.equal(first.status, 'appended');
    t.equal(first.hwm, 2);
    const again = await log.append({
      tenant: ten,
      producer: 'runner-1',
      seq: 1,
      events: [out('c', 'a'), out('c', 'b')],
    });
    t.same({ status: again.status, hwm: again.hwm }, { status: 'duplicate', hwm: 2 });
    const overlap = await log.append({
      tenant: ten,
      producer: 'runner-1',
      seq: 2,
      events: [out('c', 'b'), out('c', 'c')],
    });
    t.equal(overlap.status, 'appended');
    t.same(
      overlap.events.map((e) => e.data),
      ['c'],
      'only the event beyond the mark',
    );
    const gap = await log.append({ tenant: ten, producer: 'runner-1', seq: 9, events: [out('c', 'z')] });
    t.same({ status: gap.status, hwm: gap.hwm }, { status: 'gap', hwm: 3 });
    const stored = await log.read(ten, { after: 0, limit: 10 });
    t.same(
      stored.map((e) => e.data),
      ['a', 'b', 'c'],
      'each stored once',
    );
  });

  t.test('a watcher joining mid-burst sees every event after its position once, in order', async (t) => {
    const log = await make();
    const ten = tenant();
    const burst = producer(log, ten, 'p', 'c');
    await burst(50);
    const position = (await log.read(ten, { after: 0, limit: 100 }))[24]?.id as number;
    const seen: LogEvent[] = [];
    const appending = burst(200);
    const stop = await follow(log, ten, position, { onEvents: (events) => seen.push(...events) }, { pageSize: 7 });
    await appending;
    await burst(20);
    await new Promise((r) => setTimeout(r, 200));
    stop();
    const expected = (await log.read(ten, { after: position, limit: 1000 })).map((e) => e.id);
    t.equal(expected.length, 245);
    t.same(
      seen.map((e) => e.id),
      expected,
      'every event after the position, once, in id order, history then live',
    );
  });

  t.test('a watcher joining "now" mid-burst sees every event after its start once, in order', async (t) => {
    const log = await make();
    const ten = tenant();
    const burst = producer(log, ten, 'p', 'c');
    await burst(30);
    const seen: LogEvent[] = [];
    const starts: number[] = [];
    const seenAtStart: number[] = [];
    const lastBefore = await log.lastId(ten);
    // Appends from two producers race the joining: each one's script runs before or after the
    // start is read, and nothing may fall between the two.
    const other = producer(log, ten, 'q', 'd', 'q');
    const appending = Promise.all([burst(150), other(150)]);
    const stop = await follow(
      log,
      ten,
      'now',
      { onEvents: (events) => seen.push(...events) },
      {
        onStart: (at) => {
          starts.push(at);
          seenAtStart.push(seen.length);
        },
      },
    );
    await appending;
    await burst(20);
    await new Promise((r) => setTimeout(r, 200));
    stop();
    t.equal(starts.length, 1, 'told its start once');
    t.same(seenAtStart, [0], 'before anything was delivered');
    const start = starts[0] as number;
    t.ok(start >= lastBefore, 'the start is the last id once subscribed, not an earlier one');
    const expected = (await log.read(ten, { after: start, limit: 1000 })).map((e) => e.id);
    t.ok(expected.length >= 20, `${expected.length} events after the start`);
    t.same(
      seen.map((e) => e.id),
      expected,
      'every event after the start, once, in id order, and none at or before it',
    );
  });

  t.test('live batches carry the id before them', async (t) => {
    const log = await make();
    const ten = tenant();
    const batches: { prev: number; ids: number[] }[] = [];
    const stop = await log.subscribe(ten, (b) => batches.push({ prev: b.prev, ids: b.events.map((e) => e.id) }));
    await log.append({ tenant: ten, producer: 'p', seq: 1, events: [out('c', 'a'), out('c', 'b')] });
    await log.append({ tenant: ten, producer: 'p', seq: 3, events: [out('c', 'c')] });
    await new Promise((r) => setTimeout(r, 100));
    stop();
    t.equal(batches.length, 2);
    t.equal(batches[0]?.prev, 0);
    t.equal(batches[1]?.prev, batches[0]?.ids.at(-1), 'prev is the last id of the batch before');
  });

  t.test('dropping a tenant forgets its events, marks and live feed, and no other tenant', async (t) => {
    const log = await make();
    const gone = tenant();
    const kept = tenant();
    await log.append({ tenant: gone, producer: 'p', seq: 1, events: [out('c1', 'a'), out('c1', 'b')] });
    await log.append({ tenant: gone, producer: 'q', seq: 1, events: [out('c2', 'x')] });
    await log.append({ tenant: kept, producer: 'p', seq: 1, events: [out('c1', 'k')] });
    const last = await log.lastId(gone);
    const before: string[] = [];
    await log.subscribe(gone, (b) => before.push(...b.events.map((e) => e.data ?? '')));
    await log.dropTenant(gone);
    await log.dropTenant(gone);
    t.same(await log.read(gone, { after: 0, limit: 10 }), [], 'no events');
    t.same(await log.read(gone, { after: 0, limit: 10, conversationId: 'c1' }), [], 'no conversation stream');
    t.equal(await log.lastId(gone), 0, 'no last id');
    t.same(
      (await log.read(kept, { after: 0, limit: 10 })).map((e) => e.data),
      ['k'],
      'another tenant keeps its events',
    );
    const keptAgain = await log.append({ tenant: kept, producer: 'p', seq: 1, events: [out('c1', 'k')] });
    t.equal(keptAgain.status, 'duplicate', "and its producers' marks");

    const after: string[] = [];
    await log.subscribe(gone, (b) => after.push(...b.events.map((e) => e.data ?? '')));
    const fresh = await log.append({ tenant: gone, producer: 'p', seq: 1, events: [out('c1', 'new')] });
    t.equal(fresh.status, 'appended', "the producer's mark was forgotten");
    t.ok((fresh.events[0]?.id as number) > last, 'ids still go up');
    const deadline = Date.now() + 5000;
    while (after.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    t.same(after, ['new'], 'a feed opened afterwards hears the new event');
    t.same(before, [], 'the feed that was open when the tenant was dropped hears nothing more');
  });

  if (options.loseData) {
    const loseData = options.loseData;
    t.test('after the store loses its data, ids still never go back', async (t) => {
      const log = await make();
      const ten = tenant();
      const before = await log.append({ tenant: ten, producer: 'p', seq: 1, events: [out('c', 'a')] });
      const high = before.events[0]?.id as number;
      await loseData();
      const after = await log.append({ tenant: ten, producer: 'p2', seq: 1, events: [out('c', 'b')] });
      t.ok((after.events[0]?.id as number) > high, `${after.events[0]?.id} > ${high}`);
    });
  }
}
