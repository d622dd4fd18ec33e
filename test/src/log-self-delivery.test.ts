// A node that is the only one following a tenant's live channel delivers its own appends to its
// watchers from the append's reply, without publishing them (the round trip through Redis
// pub/sub saved); as soon as another node follows the tenant, every append is published again.
// On a Redis server of this file's own, so its command counts are this file's alone.
import { Redis } from 'ioredis';
import t, { type Test } from 'tap';
import { redisEventLog } from '../../gateway/src/log/log.redis.ts';
import type { LiveBatch, LogEvent } from '../../gateway/src/log/log.ts';
import { haveRedis, ownRedisServer } from './own-redis.ts';
import { until } from './until.ts';

const TENANT = 'acc_self';
const event = (data: string) => ({ conversationId: 'cnv_1', kind: 'output', stream: 'stdout', data });

/** One node's event log: its command connection and its subscriber. */
function node(t: Test, port: number) {
  const redis = new Redis(port, { lazyConnect: false });
  const sub = new Redis(port, { lazyConnect: false });
  t.teardown(() => {
    redis.disconnect();
    sub.disconnect();
  });
  const log = redisEventLog(redis, sub, { prefix: 'self:' });
  let seq = 0;
  const producer = `p${Math.random().toString(36).slice(2, 8)}`;
  /** Appends `n` events, one append each, all sent at once. */
  const append = (n: number, label: string) =>
    Promise.all(
      Array.from({ length: n }, (_, i) => {
        seq++;
        return log.append({ tenant: TENANT, producer, seq, events: [event(`${label} ${i}`)] });
      }),
    );
  return { log, redis, sub, append };
}

/** A subscription that records every event it is handed, and checks each batch's `prev`. */
async function follower(t: Test, n: ReturnType<typeof node>) {
  const got: LogEvent[] = [];
  const broken: string[] = [];
  let last = await n.log.lastId(TENANT);
  const end = await n.log.subscribe(TENANT, (b: LiveBatch) => {
    if (b.prev > last) broken.push(`batch after ${b.prev} delivered at ${last}`);
    for (const e of b.events) {
      if (e.id <= last) broken.push(`${e.id} after ${last}`);
      last = e.id;
      got.push(e);
    }
  });
  t.teardown(() => end());
  return { got, broken, end };
}

async function spublishCalls(redis: Redis): Promise<number> {
  const stats = await redis.info('commandstats');
  return Number(/cmdstat_spublish:calls=(\d+)/.exec(stats)?.[1] ?? 0);
}

t.test(
  'a node alone on a tenant delivers its appends itself',
  { skip: !haveRedis() && 'no redis-server' },
  async (t) => {
    const server = await ownRedisServer(t, 'self-delivery');
    const admin = new Redis(server.port);
    t.teardown(() => admin.disconnect());
    const all = async () =>
      admin.xrange(`self:{t:${TENANT}}:log`, '-', '+').then((rows) => rows.map(([id]) => Number(id.slice(0, -2))));

    const a = node(t, server.port);
    const b = node(t, server.port);
    const fa = await follower(t, a);

    await t.test('alone: every append reaches its watchers, none is published', async (t) => {
      const before = await spublishCalls(admin);
      await a.append(50, 'alone');
      await until('all 50 delivered', () => fa.got.length === 50 || undefined);
      // Sent on one connection, run in the order sent.
      t.same(
        fa.got.map((e) => e.data),
        Array.from({ length: 50 }, (_, i) => `alone ${i}`),
      );
      t.same(
        fa.got.map((e) => e.id),
        await all(),
        'the log, whole and in order',
      );
      t.same(fa.broken, [], 'no batch out of order or after a hole');
      t.equal(await spublishCalls(admin), before, 'no SPUBLISH');
    });

    await t.test('a node that appends without following publishes: both kinds arrive in order', async (t) => {
      const before = await spublishCalls(admin);
      await Promise.all([a.append(100, 'a'), b.append(100, 'b')]);
      const ids = await all();
      await until('every event delivered', () => fa.got.length === ids.length || undefined);
      t.same(
        fa.got.map((e) => e.id),
        ids,
        'every event once, in id order',
      );
      t.same(fa.broken, []);
      t.equal((await spublishCalls(admin)) - before, 100, "b's appends are published, a's are not");
    });

    const fb = await follower(t, b);
    await t.test('with a second node following, every append is published and both see all', async (t) => {
      const before = await spublishCalls(admin);
      await Promise.all([a.append(40, 'a2'), b.append(40, 'b2')]);
      const ids = await all();
      await until('a has everything', () => fa.got.length === ids.length || undefined);
      await until('b has the 80 new ones', () => fb.got.length === 80 || undefined);
      t.same(
        fa.got.map((e) => e.id),
        ids,
      );
      t.same(
        fb.got.map((e) => e.id),
        ids.slice(-80),
      );
      t.same([...fa.broken, ...fb.broken], []);
      t.equal((await spublishCalls(admin)) - before, 80, 'all 80 published');
    });

    await t.test('a node that stops following does not leave the other without its appends', async (t) => {
      // The appends are sent, then a lets go at once: its SUNSUBSCRIBE must not reach Redis
      // before them, or they would go unpublished with b following.
      const from = fb.got.length;
      const sent = a.append(200, 'leaving');
      fa.end();
      await sent;
      const ids = await all();
      await until('b has all 200 without any later publish', () => fb.got.length - from === 200 || undefined, 5000);
      t.same(
        fb.got.map((e) => e.id),
        ids.slice(ids.length - fb.got.length),
      );
      t.same(fb.broken, []);
    });

    await t.test('a node whose subscriber connection dropped publishes until it follows again', async (t) => {
      const fa2 = await follower(t, a);
      const base = fb.got.length;
      const closed = new Promise((r) => a.sub.once('close', r));
      await admin.client('KILL', 'ID', String(await a.sub.client('ID')));
      await closed;
      await a.append(10, 'dropped');
      await until('b has the 10', () => fb.got.length - base === 10 || undefined, 5000);
      await until(
        'a is subscribed again',
        async () =>
          ((await admin.call('PUBSUB', 'SHARDNUMSUB', `self:{t:${TENANT}}:live`)) as [string, number])[1] === 2 ||
          undefined,
        5000,
      );
      await a.append(10, 'back');
      const ids = await all();
      await until('b has the next 10', () => fb.got.length - base === 20 || undefined, 5000);
      await until('a has all 20', () => fa2.got.length === 20 || undefined, 5000);
      t.same(
        fa2.got.map((e) => e.id),
        ids.slice(-20),
        'a: what it appended while reconnecting, then the rest',
      );
      t.same([...fa2.broken, ...fb.broken], []);
    });
  },
);
