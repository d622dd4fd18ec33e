import t from 'tap';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import type { EventLog, LiveBatch } from '../../gateway/src/log/log.ts';
import { LiveFeeds } from '../../gateway/src/streams/live-feeds.ts';

/** The memory log, counting the subscriptions the node makes to it. */
function countedLog(): { log: EventLog; subscriptions: () => number } {
  const log = memoryEventLog();
  let live = 0;
  return {
    log: {
      ...log,
      async subscribe(tenant, onBatch) {
        const stop = await log.subscribe(tenant, onBatch);
        live++;
        return () => {
          live--;
          stop();
        };
      },
    },
    subscriptions: () => live,
  };
}

const settle = () => new Promise((r) => setTimeout(r, 10));

/** One stdout event of `conversationId`, appended by producer `p` at `seq`. */
const appendOne = (log: EventLog, tenant: string, seq: number, conversationId: string, data: string) =>
  log.append({ tenant, producer: 'p', seq, events: [{ conversationId, kind: 'output', stream: 'stdout', data }] });

const sink = (into: LiveBatch[]) => ({ onBatch: (x: LiveBatch) => into.push(x) });

t.test(
  'a conversation watcher receives only the events of its conversation, a whole-log watcher all, in order',
  async (t) => {
    const { log } = countedLog();
    const feeds = new LiveFeeds(log);
    const a: LiveBatch[] = [];
    const b: LiveBatch[] = [];
    const all: LiveBatch[] = [];
    const [sa, sb, sall] = [sink(a), sink(b), sink(all)];
    await feeds.subscribe('acc_1', 'cnv_a', sa);
    await feeds.subscribe('acc_1', 'cnv_b', sb);
    await feeds.subscribe('acc_1', null, sall);
    await log.append({
      tenant: 'acc_1',
      producer: 'p',
      seq: 1,
      events: [
        { conversationId: 'cnv_a', kind: 'output', stream: 'stdout', data: 'a1' },
        { conversationId: 'cnv_b', kind: 'output', stream: 'stdout', data: 'b1' },
        { conversationId: null, kind: 'conversations', stream: 'stage', data: '{}' },
        { conversationId: 'cnv_a', kind: 'output', stream: 'stdout', data: 'a2' },
      ],
    });
    await appendOne(log, 'acc_1', 5, 'cnv_b', 'b2');
    await appendOne(log, 'acc_2', 1, 'cnv_a', 'other tenant');
    await settle();
    t.same(
      a.flatMap((x) => x.events.map((e) => e.data)),
      ['a1', 'a2'],
    );
    t.same(
      b.flatMap((x) => x.events.map((e) => e.data)),
      ['b1', 'b2'],
    );
    t.same(
      all.map((x) => x.events.map((e) => e.data)),
      [['a1', 'b1', '{}', 'a2'], ['b2']],
      'the whole log, batch by batch as published',
    );
    feeds.unsubscribe('acc_1', 'cnv_a', sa);
    feeds.unsubscribe('acc_1', null, sall);
    await appendOne(log, 'acc_1', 6, 'cnv_a', 'a3');
    await settle();
    t.equal(a.length, 1, 'nothing after unsubscribe');
    t.equal(all.length, 2);
    feeds.unsubscribe('acc_1', 'cnv_b', sb);
  },
);

t.test('the node subscribes to a tenant once however many watchers follow it, and lets go with the last', async (t) => {
  const { log, subscriptions } = countedLog();
  const feeds = new LiveFeeds(log);
  const sinks = Array.from({ length: 20 }, () => ({ onBatch: () => {} }));
  const scope = (i: number) => (i % 5 === 4 ? null : `cnv_${i % 4}`);
  await Promise.all(sinks.map((s, i) => feeds.subscribe('acc_1', scope(i), s)));
  t.equal(subscriptions(), 1);
  for (const [i, s] of sinks.entries()) if (i > 0) feeds.unsubscribe('acc_1', scope(i), s);
  t.equal(subscriptions(), 1, 'one watcher left keeps it');
  feeds.unsubscribe('acc_1', scope(0), sinks[0] as (typeof sinks)[0]);
  feeds.unsubscribe('acc_1', scope(0), sinks[0] as (typeof sinks)[0]);
  await settle();
  t.equal(subscriptions(), 0, 'gone with the last watcher (a second unsubscribe does nothing)');
  const again = { onBatch: () => {} };
  await feeds.subscribe('acc_1', null, again);
  t.equal(subscriptions(), 1, 'a later watcher subscribes anew');
  feeds.unsubscribe('acc_1', null, again);
});
