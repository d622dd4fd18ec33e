/**
 * The event log and the rate limiter on a Redis Cluster of three masters started by this file:
 * the same contracts as on one server, live delivery across shards and across a slot that
 * moves, and the service itself started with REDIS_CLUSTER=true.
 */
import { createLogger, loadConfig } from '@svc/gateway';
import { EventSource } from 'eventsource';
import { type Cluster, Redis } from 'ioredis';
import t from 'tap';
import { follow } from '../../gateway/src/log/follow.ts';
import { eventLogContract } from '../../gateway/src/log/log.contract.ts';
import { logKeys, redisEventLog } from '../../gateway/src/log/log.redis.ts';
import type { LogEvent, NewEvent } from '../../gateway/src/log/log.ts';
import { rateLimiterContract } from '../../gateway/src/ratelimit/ratelimit.contract.ts';
import { redisRateLimiter } from '../../gateway/src/ratelimit/ratelimit.redis.ts';
import { connectRedis, type RedisConnections } from '../../gateway/src/redis.ts';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import {
  type ClusterNodeProcess,
  clusterUnavailable,
  startRedisCluster,
  type TestRedisCluster,
} from './redis-cluster.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const out = (conversationId: string, data: string): NewEvent => ({
  conversationId,
  kind: 'output',
  stream: 'stdout',
  data,
});
const run = Math.random().toString(36).slice(2, 8);

/** The port of the master that owns `key`'s slot, as the cluster itself says now. */
async function ownerOf(admin: Cluster, key: string): Promise<number> {
  const slot = Number(await admin.cluster('KEYSLOT', key));
  const ranges = (await admin.call('CLUSTER', 'SLOTS')) as [number, number, [string, number, ...unknown[]]][];
  const range = ranges.find(([from, to]) => slot >= from && slot <= to);
  if (!range) throw new Error(`no master owns slot ${slot}`);
  return Number(range[2][1]);
}

/** Tenant names whose keys land on the given number of different masters, one per master. */
async function tenantsOnMasters(admin: Cluster, prefix: string, masters: number, label: string) {
  const byMaster = new Map<number, string>();
  for (let i = 0; byMaster.size < masters; i++) {
    if (i > 200) throw new Error(`could not spread tenants over ${masters} masters`);
    const tenant = `${label}${run}${i}`;
    const port = await ownerOf(admin, logKeys(prefix, tenant).seq);
    if (!byMaster.has(port)) byMaster.set(port, tenant);
  }
  return [...byMaster.entries()].map(([port, tenant]) => ({ port, tenant }));
}

async function until(done: () => boolean, ms = 5000) {
  for (const deadline = Date.now() + ms; !done() && Date.now() < deadline; ) await sleep(20);
}

t.test('REDIS_CLUSTER is validated with REDIS_URL and REDIS_KEY_PREFIX', async (t) => {
  t.equal(loadConfig({}).REDIS_CLUSTER, false, 'off by default');
  t.equal(loadConfig({ REDIS_URL: 'redis://a:7000,redis://b:7000', REDIS_CLUSTER: 'yes' }).REDIS_CLUSTER, true);
  t.throws(() => loadConfig({ REDIS_CLUSTER: 'maybe' }), /REDIS_CLUSTER/);
  t.throws(() => loadConfig({ REDIS_CLUSTER: 'true' }), /REDIS_URL: required when REDIS_CLUSTER=true/);
  t.throws(
    () => loadConfig({ REDIS_URL: 'redis://a:7000', REDIS_CLUSTER: 'true', REDIS_KEY_PREFIX: '{svc}:' }),
    /REDIS_KEY_PREFIX: must not contain \{ or \}/,
    'a brace in the prefix would replace the tenant hash tag',
  );
  await t.rejects(
    connectRedis(loadConfig({ REDIS_URL: '127.0.0.1:7000', REDIS_CLUSTER: 'true' }), createLogger('silent')),
    /REDIS_URL: with REDIS_CLUSTER=true, each comma-separated seed must be a redis:\/\/ URL/,
  );
});

const unavailable = clusterUnavailable();

t.test('on a Redis Cluster of three masters', { skip: unavailable ?? false }, async (t) => {
  const cluster: TestRedisCluster = await startRedisCluster(3);
  t.teardown(() => cluster.stop());
  const logger = createLogger('silent');
  const config = (prefix = '') =>
    loadConfig({ REDIS_URL: cluster.url, REDIS_CLUSTER: 'true', REDIS_KEY_PREFIX: prefix, LOG_LEVEL: 'silent' });
  const opened: RedisConnections[] = [];
  const connect = async () => {
    const c = await connectRedis(config(), logger);
    opened.push(c);
    return c;
  };
  t.teardown(async () => {
    for (const c of opened) await c.close().catch(() => {});
  });
  const admin = (await connect()).redis as Cluster;
  t.equal(admin.nodes('master').length, 3, 'the service sees three masters');

  t.test('event log contract', async (t) => {
    const prefix = `clog${run}:`;
    eventLogContract(
      t,
      async () => {
        const { redis, subscriber } = await connect();
        return redisEventLog(redis, subscriber, { prefix });
      },
      {
        // Losing data: every key of this run is gone from every master, counters and marks too.
        loseData: async () => {
          for (const node of admin.nodes('master')) {
            for (const key of await node.keys(`${prefix}*`)) await node.del(key);
          }
        },
      },
    );
  });

  t.test('rate limiter contract', async (t) => {
    const { redis } = await connect();
    rateLimiterContract(t, (o) => redisRateLimiter(redis, o, `crl${run}:`));
  });

  t.test('a Cluster subscriber without shardedSubscribers is refused', async (t) => {
    const { redis } = await connect();
    t.throws(() => redisEventLog(redis, redis), /shardedSubscribers: true/);
  });

  t.test('live delivery on every shard', async (t) => {
    const prefix = `clive${run}:`;
    const { redis, subscriber } = await connect();
    const log = redisEventLog(redis, subscriber, { prefix });
    const tenants = await tenantsOnMasters(admin, prefix, 3, 'live');
    t.same(new Set(tenants.map((x) => x.port)).size, 3, 'one tenant on each master');

    t.test('a tenant keeps all its keys on one shard, and its subscription on that shard', async (t) => {
      for (const { port, tenant } of tenants) {
        await log.append({ tenant, producer: 'p', seq: 1, events: [out('c', 'x')] });
        const keys = logKeys(prefix, tenant);
        const owners = await Promise.all(
          [keys.seq, keys.log, keys.conversation('c'), keys.producer('p'), keys.trim, keys.live].map((k) =>
            ownerOf(admin, k),
          ),
        );
        t.same(new Set(owners), new Set([port]), `${tenant}: every key on the master at ${port}`);
        const stop = await log.subscribe(tenant, () => {});
        const node = admin.nodes('master').find((n) => n.options.port === port) as Redis;
        t.same(
          await node.call('PUBSUB', 'SHARDNUMSUB', keys.live),
          [keys.live, 1],
          `${tenant}: the SSUBSCRIBE went to the owner of the channel's slot`,
        );
        stop();
      }
    });

    t.test('watchers joining mid-burst on three shards at once: each sees everything once', async (t) => {
      const fresh = await tenantsOnMasters(admin, prefix, 3, 'burst');
      await Promise.all(
        fresh.map(async ({ port, tenant }) => {
          let seq = 0;
          const burst = async (count: number) => {
            for (let i = 0; i < count; i++) {
              await log.append({ tenant, producer: 'p', seq: ++seq, events: [out('c', String(seq))] });
            }
          };
          await burst(30);
          const position = (await log.read(tenant, { after: 0, limit: 100 }))[14]?.id as number;
          const seen: LogEvent[] = [];
          const appending = burst(150);
          const stop = await follow(
            log,
            tenant,
            position,
            { onEvents: (events) => seen.push(...events) },
            { pageSize: 7 },
          );
          await appending;
          await burst(10);
          const expected = (await log.read(tenant, { after: position, limit: 1000 })).map((e) => e.id);
          await until(() => seen.length >= expected.length);
          await sleep(100);
          stop();
          t.equal(expected.length, 175, `${tenant} on the master at ${port}`);
          t.same(
            seen.map((e) => e.id),
            expected,
            `${tenant}: every event after the position, once, in id order, history then live`,
          );
        }),
      );
    });

    t.test('two tenants on different masters, followed at once, both deliver', async (t) => {
      const [a, b] = tenants as [{ port: number; tenant: string }, { port: number; tenant: string }];
      t.not(a.port, b.port, 'different masters');
      const seen: Record<string, string[]> = { [a.tenant]: [], [b.tenant]: [] };
      const after = { a: await log.lastId(a.tenant), b: await log.lastId(b.tenant) };
      const stopA = await follow(log, a.tenant, after.a, {
        onEvents: (e) => seen[a.tenant]?.push(...e.map((x) => x.data ?? '')),
      });
      const stopB = await follow(log, b.tenant, after.b, {
        onEvents: (e) => seen[b.tenant]?.push(...e.map((x) => x.data ?? '')),
      });
      const sent = Array.from({ length: 20 }, (_, i) => `m${i}`);
      for (const [i, data] of sent.entries()) {
        await log.append({ tenant: a.tenant, producer: 'two', seq: i + 1, events: [out('c', data)] });
        await log.append({ tenant: b.tenant, producer: 'two', seq: i + 1, events: [out('c', data)] });
      }
      await until(() => seen[a.tenant]?.length === 20 && seen[b.tenant]?.length === 20);
      stopA();
      stopB();
      t.same(seen[a.tenant], sent, `on the master at ${a.port}`);
      t.same(seen[b.tenant], sent, `on the master at ${b.port}`);
    });
  });

  t.test('a slot that moves to another master: what was published while nobody listened arrives', async (t) => {
    const prefix = `cmove${run}:`;
    const { redis, subscriber } = await connect();
    const log = redisEventLog(redis, subscriber, { prefix });
    const [{ port: srcPort, tenant }] = (await tenantsOnMasters(admin, prefix, 1, 'move')) as [
      { port: number; tenant: string },
    ];
    const keys = logKeys(prefix, tenant);
    const slot = Number(await admin.cluster('KEYSLOT', keys.live));
    const ports = cluster.nodes.map((n) => n.port);
    const [dstPort, thirdPort] = ports.filter((p) => p !== srcPort) as [number, number];
    const [src, dst, third] = [srcPort, dstPort, thirdPort].map((port) => new Redis(port, '127.0.0.1'));
    t.teardown(async () => {
      for (const n of [src, dst, third]) await n?.quit();
    });
    const [srcId, dstId] = (await Promise.all([src, dst].map((n) => n?.cluster('MYID')))) as [string, string];

    let seq = 0;
    const append = (data: string) =>
      log.append({ tenant, producer: 'p', seq: ++seq, events: [out('c', data)] }).then((r) => {
        if (r.status !== 'appended') throw new Error(`append ${data}: ${r.status}`);
      });
    const seen: string[] = [];
    for (let i = 0; i < 3; i++) await append(`before ${i}`);
    const stop = await follow(log, tenant, 0, { onEvents: (events) => seen.push(...events.map((e) => e.data ?? '')) });
    t.teardown(stop);
    await until(() => seen.length === 3);

    // Move the slot by hand, as `redis-cli --cluster reshard` does, pausing where the new owner
    // serves the slot but the old one has not yet dropped this node's subscription.
    await dst?.cluster('SETSLOT', slot, 'IMPORTING', srcId);
    await src?.cluster('SETSLOT', slot, 'MIGRATING', dstId);
    const moving = (await src?.cluster('GETKEYSINSLOT', slot, 100)) as string[];
    t.ok(moving.length >= 4, `${moving.length} keys of the tenant move`);
    await src?.migrate('127.0.0.1', dstPort, '', 0, 5000, 'KEYS', ...moving);
    await dst?.cluster('SETSLOT', slot, 'NODE', dstId);
    await append('while moving');
    t.same(
      await dst?.call('PUBSUB', 'SHARDNUMSUB', keys.live),
      [keys.live, 0],
      'the append was published on the new owner while nobody listened there',
    );
    await third?.cluster('SETSLOT', slot, 'NODE', dstId);
    // The old owner gives the slot up and sends SUNSUBSCRIBE; ioredis moves the subscription.
    await src?.cluster('SETSLOT', slot, 'NODE', dstId);
    await until(() => seen.length === 4);
    t.same(
      seen,
      ['before 0', 'before 1', 'before 2', 'while moving'],
      'the missed event is read from the stream once the subscription is back, with nothing appended after it',
    );
    t.same(await dst?.call('PUBSUB', 'SHARDNUMSUB', keys.live), [keys.live, 1], 'subscribed on the new owner');
    t.same(await src?.call('PUBSUB', 'SHARDNUMSUB', keys.live), [keys.live, 0], 'and no longer on the old one');
    for (let i = 0; i < 5; i++) await append(`after ${i}`);
    await until(() => seen.length === 9);
    t.same(
      seen.slice(4),
      Array.from({ length: 5 }, (_, i) => `after ${i}`),
      'live again from the new owner, nothing twice',
    );
    t.equal(await ownerOf(admin, keys.seq), dstPort, 'the tenant now lives on the other master');
  });

  t.test('a master restarts empty: its tenant is followed on, ids never go back', async (t) => {
    const prefix = `crestart${run}:`;
    const { redis, subscriber } = await connect();
    const log = redisEventLog(redis, subscriber, { prefix });
    const [{ port, tenant }] = (await tenantsOnMasters(admin, prefix, 1, 'restart')) as [
      { port: number; tenant: string },
    ];
    let seq = 0;
    // A producer resends until the log has it; while the master is down the append fails.
    const append = async (data: string) => {
      const mine = ++seq;
      for (const deadline = Date.now() + 10_000; ; ) {
        try {
          const r = await log.append({ tenant, producer: 'p', seq: mine, events: [out('c', data)] });
          if (r.status !== 'gap') return;
        } catch (err) {
          if (Date.now() > deadline) throw err;
          await sleep(50);
        }
      }
    };
    const seen: LogEvent[] = [];
    const stop = await follow(log, tenant, 0, { onEvents: (events) => seen.push(...events) });
    t.teardown(stop);
    for (let i = 0; i < 3; i++) await append(`before ${i}`);
    await until(() => seen.length === 3);
    await cluster.restart(port);
    t.equal((await cluster.cli(port, 'dbsize')).trim(), '0', `the master at ${port} came back empty`);
    for (let i = 0; i < 3; i++) await append(`after ${i}`);
    await until(() => seen.length === 6, 10_000);
    t.same(
      seen.map((e) => e.data),
      ['before 0', 'before 1', 'before 2', 'after 0', 'after 1', 'after 2'],
      'everything once, in order, across the restart',
    );
    t.ok(
      seen.every((e, i) => i === 0 || e.id > (seen[i - 1] as LogEvent).id),
      'ids increase',
    );
  });

  t.test('the service refuses a cluster node without REDIS_CLUSTER, and a master that may evict', async (t) => {
    const [first, second] = cluster.nodes as [ClusterNodeProcess, ClusterNodeProcess];
    await t.rejects(
      startTestService(t, { backend: 'embedded', env: { REDIS_URL: `redis://127.0.0.1:${first.port}` } }),
      /REDIS_CLUSTER: REDIS_URL is a Redis Cluster node/,
    );
    await cluster.cli(second.port, 'config', 'set', 'maxmemory-policy', 'allkeys-lru');
    try {
      await t.rejects(
        startTestService(t, { backend: 'embedded', env: { REDIS_URL: cluster.url, REDIS_CLUSTER: 'true' } }),
        new RegExp(`maxmemory-policy noeviction \\(it has allkeys-lru on 127\\.0\\.0\\.1:${second.port}\\)`),
        'every master is checked, and the one at fault is named',
      );
    } finally {
      await cluster.cli(second.port, 'config', 'set', 'maxmemory-policy', 'noeviction');
    }
    if (process.env.TEST_REDIS_URL) {
      await t.rejects(
        startTestService(t, {
          backend: 'embedded',
          env: { REDIS_URL: process.env.TEST_REDIS_URL, REDIS_CLUSTER: 'true' },
        }),
        /could not join a Redis Cluster .*cluster support disabled/,
        'a plain server named with REDIS_CLUSTER=true',
      );
    }
  });

  t.test('the service with REDIS_CLUSTER=true: appends reach stream watchers on two masters', async (t) => {
    const prefix = `csvc${run}:`;
    const svc = await startTestService(t, {
      backend: primaryBackend(),
      env: {
        REDIS_URL: cluster.url,
        REDIS_CLUSTER: 'true',
        REDIS_KEY_PREFIX: prefix,
        // The edge's limiter runs on the cluster too (high enough never to refuse here).
        RATE_LIMIT_PER_MINUTE: '100000',
      },
    });
    // Accounts are tenants: sign up until two of them live on different masters.
    const accounts: { key: string; accountId: string; port: number }[] = [];
    for (let i = 0; i < 12 && new Set(accounts.map((a) => a.port)).size < 2; i++) {
      const me = await signUp(svc);
      const port = await ownerOf(admin, logKeys(prefix, me.accountId).seq);
      if (!accounts.some((a) => a.port === port)) accounts.push({ ...me, port });
    }
    t.equal(accounts.length, 2, `two accounts on masters ${accounts.map((a) => a.port).join(' and ')}`);

    const watchers = await Promise.all(
      accounts.map(async (me) => {
        const conv = await createConversationRecord(
          svc.db.sql,
          { accountId: me.accountId, actor: 'api', ip: null },
          { agentId: 'agt_x' },
        );
        let seq = 0;
        const append = (data: string) =>
          svc.appendEvents({
            tenant: me.accountId,
            producer: 'runner',
            seq: ++seq,
            events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data }],
          });
        await append('before');
        const seen: { id: number; data: string }[] = [];
        const es = new EventSource(`${svc.url}/api/conversations/${conv.id}/stream?wait=true`, {
          fetch: (input, init) =>
            fetch(input, { ...init, headers: { ...(init?.headers ?? {}), authorization: `Bearer ${me.key}` } }),
        });
        t.teardown(() => es.close());
        es.addEventListener('message', (m) => seen.push({ id: Number(m.lastEventId), data: JSON.parse(m.data).data }));
        return { me, conv, append, seen };
      }),
    );
    await until(() => watchers.every((w) => w.seen.length === 1));
    for (let i = 0; i < 10; i++) for (const w of watchers) await w.append(`live ${i}`);
    await until(() => watchers.every((w) => w.seen.length === 11));
    const expected = ['before', ...Array.from({ length: 10 }, (_, i) => `live ${i}`)];
    for (const w of watchers) {
      t.same(
        w.seen.map((s) => s.data),
        expected,
        `the watcher of the account on ${w.me.port} sees the history, then every live event once`,
      );
      t.ok(
        w.seen.every((s, i) => i === 0 || s.id > (w.seen[i - 1] as { id: number }).id),
        'ids increase',
      );
      const feed = await svc.http.get(`/api/conversations/${w.conv.id}/events?limit=100`, { token: w.me.key });
      t.same(
        feed.body.data.map((e: { id: number }) => e.id),
        w.seen.map((s) => s.id),
        'the JSON feed agrees',
      );
    }
    const bucket = `${prefix}rl:{127.0.0.1}`;
    t.equal(await admin.exists(bucket), 1, `the edge's rate-limit bucket is on the cluster (${bucket})`);
  });
});
