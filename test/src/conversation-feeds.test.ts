import t from 'tap';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import type { EventLog, LiveBatch } from '../../gateway/src/log/log.ts';
import { ConversationFeeds } from '../../gateway/src/streams/conversation-feeds.ts';

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

t.test('a conversation watcher receives only the events of its conversation, in order', async (t) => {
  const { log } = countedLog();
  const feeds = new ConversationFeeds(log);
  const a: LiveBatch[] = [];
  const b: LiveBatch[] = [];
  const stopA = await feeds.subscribe('acc_1', 'cnv_a', { onBatch: (x) => a.push(x) });
  const stopB = await feeds.subscribe('acc_1', 'cnv_b', { onBatch: (x) => b.push(x) });
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
  await log.append({
    tenant: 'acc_1',
    producer: 'p',
    seq: 5,
    events: [{ conversationId: 'cnv_b', kind: 'output', stream: 'stdout', data: 'b2' }],
  });
  await settle();
  t.same(
    a.flatMap((x) => x.events.map((e) => e.data)),
    ['a1', 'a2'],
  );
  t.same(
    b.flatMap((x) => x.events.map((e) => e.data)),
    ['b1', 'b2'],
  );
  stopA();
  stopB();
});

t.test(
  'the node subscribes to a tenant once however many conversations it follows, and lets go with the last',
  async (t) => {
    const { log, subscriptions } = countedLog();
    const feeds = new ConversationFeeds(log);
    const stops = await Promise.all(
      Array.from({ length: 20 }, (_, i) => feeds.subscribe('acc_1', `cnv_${i % 4}`, { onBatch: () => {} })),
    );
    t.equal(subscriptions(), 1);
    for (const stop of stops.slice(1)) stop();
    t.equal(subscriptions(), 1, 'one watcher left keeps it');
    stops[0]?.();
    stops[0]?.();
    await settle();
    t.equal(subscriptions(), 0, 'gone with the last watcher');
    const again = await feeds.subscribe('acc_1', 'cnv_0', { onBatch: () => {} });
    t.equal(subscriptions(), 1, 'a later watcher subscribes anew');
    again();
  },
);
