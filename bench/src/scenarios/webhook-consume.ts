import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { accounts, conversations, migrate, openDatabase, webhooks } from '@svc/db';
import { createLogger } from '@svc/gateway';
import { Redis } from 'ioredis';
import { redisConsumerGroups } from '../../../gateway/src/log/consumer.redis.ts';
import { logKeys, redisEventLog } from '../../../gateway/src/log/log.redis.ts';
import type { LogEvent } from '../../../gateway/src/log/log.ts';
import { enqueueWebhookJobs } from '../../../gateway/src/services/webhook-jobs.ts';
import { type StageSink, WebhookConsumer } from '../../../gateway/src/workers/webhook-consumer.ts';
import { startPostgres } from '../lib/postgres.ts';
import { startRedis } from '../lib/redis.ts';
import { absoluteTarget, type Outcome, ratioTarget, type Scenario } from '../lib/scenario.ts';
import { percentiles, round } from '../lib/stats.ts';

/** Output events appended between two stage events: the consumer reads and skips them. */
const OUTPUT_PER_STAGE = 4;

/**
 * The webhook consumer's delay: stage events appended to a tenant's log on a throwaway Redis
 * at `--rate` per second (with OUTPUT_PER_STAGE stdout events between each two, which make no
 * webhooks), read through the tenant's consumer group and handed to the service's sink,
 * which writes one delivery job per event (one endpoint taking every type) in a throwaway
 * PostgreSQL. Sending the jobs is not part of it (`npm run bench:webhooks` measures that). Measured per stage event: from the start
 * of its append to the sink's resolution, p50/p99, and stage events consumed per second.
 * Compared with a bare `XREAD BLOCK` reader of the same stream in the same process: the
 * delay any consumer fed by Redis Streams has before it does anything.
 */
export const webhookConsume: Scenario = {
  name: 'webhook-consume',
  title: 'webhook-consume: a stage event from its append to its delivery job written',
  defaults: { connections: 1, duration: 10, rate: 500 },
  smoke: { connections: 1, duration: 2, rate: 50 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    let redisUrl = opts.redis;
    if (!redisUrl) {
      progress.update('starting Redis');
      const started = await startRedis([], (s) => progress.say(s));
      defer(() => started.stop());
      redisUrl = started.url;
    }
    progress.update('starting PostgreSQL');
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const db = await openDatabase({ url: pg.url, dataDir: '/tmp', max: 4 });
    defer(() => db.close());
    await migrate(db.sql);
    const tenant = `acc_bench${randomBytes(4).toString('hex')}`;
    await accounts.insertAccount(db.sql, {
      id: tenant,
      email: `${tenant}@bench.local`,
      passwordHash: 'x',
      role: 'user',
      dataKey: randomBytes(32),
    });
    const conversationId = `cnv_bench${randomBytes(4).toString('hex')}`;
    await conversations.insertConversation(db.sql, {
      id: conversationId,
      accountId: tenant,
      agentId: 'agt_bench',
      title: '',
      source: 'ui',
    });

    // The consumer reads only accounts with an active endpoint; its secret is never read here.
    await webhooks.insertEndpoint(db.sql, {
      id: `whe_bench${randomBytes(4).toString('hex')}`,
      accountId: tenant,
      url: 'https://hooks.example.com/in',
      description: '',
      eventTypes: ['*'],
      secret: randomBytes(32),
    });
    const prefix = `bench${randomBytes(3).toString('hex')}:`;
    const redis = new Redis(redisUrl);
    const sub = new Redis(redisUrl);
    const reader = new Redis(redisUrl);
    defer(async () => {
      reader.disconnect();
      await redis.quit();
      await sub.quit();
    });
    const log = redisEventLog(redis, sub, { prefix });
    const started = new Map<number, number>(); // event id -> when its append began (ms)
    const consumed = new Map<number, number>(); // event id -> when the sink resolved
    const read = new Map<number, number>(); // event id -> when the bare reader had it
    const sink: StageSink = async (accountId, events: LogEvent[]) => {
      await enqueueWebhookJobs(db.sql, accountId, events);
      const at = performance.now();
      for (const e of events) consumed.set(e.id, at);
    };
    const consumer = new WebhookConsumer(
      {
        sql: db.sql,
        log,
        groups: redisConsumerGroups(redis, { prefix }),
        sink,
        tenants: async () => [tenant],
        logger: createLogger('warn'),
      },
      { name: 'bench', batch: 100, minIdleMs: 30_000, sweepMs: 5000 },
    );
    await consumer.start();
    defer(() => consumer.stop());

    // The baseline: one blocking reader of the tenant's stream, as a bare consumer would be.
    let reading = true;
    const key = logKeys(prefix, tenant).log;
    const bare = (async () => {
      let last = '$';
      while (reading) {
        const reply = (await reader.xread('BLOCK', 200, 'STREAMS', key, last)) as
          | [string, [string, string[]][]][]
          | null;
        const at = performance.now();
        for (const [, entries] of reply ?? []) {
          for (const [id, fields] of entries) {
            last = id;
            if ((fields[1] as string).includes('"kind":"stage"')) read.set(Number(id.slice(0, -2)), at);
          }
        }
      }
    })();

    progress.update(`appending ${opts.rate} stage events/s for ${opts.duration} s`);
    const stageIds: number[] = [];
    const intervalMs = 1000 / opts.rate;
    const begin = performance.now();
    let seq = 0;
    for (let n = 0; performance.now() - begin < opts.duration * 1000; n++) {
      const due = begin + n * intervalMs;
      const wait = due - performance.now();
      if (wait > 1) await new Promise((r) => setTimeout(r, wait));
      const output = Array.from({ length: OUTPUT_PER_STAGE }, (_, i) => ({
        conversationId,
        kind: 'output',
        stream: 'stdout',
        data: `line ${n}.${i}`,
      }));
      await log.append({ tenant, producer: 'bench', seq: seq + 1, events: output });
      seq += OUTPUT_PER_STAGE;
      const at = performance.now();
      const r = await log.append({
        tenant,
        producer: 'bench',
        seq: ++seq,
        events: [{ conversationId, kind: 'stage', stream: 'stage', stage: 'turn', state: n % 2 ? 'done' : 'started' }],
      });
      for (const e of r.events) {
        started.set(e.id, at);
        stageIds.push(e.id);
      }
    }
    const elapsed = (performance.now() - begin) / 1000;
    progress.update('waiting for the consumer to catch up');
    const deadline = performance.now() + 30_000;
    while (stageIds.some((id) => !consumed.has(id)) && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    reading = false;
    await bare;

    const delays = (done: Map<number, number>) =>
      stageIds.filter((id) => done.has(id)).map((id) => (done.get(id) as number) - (started.get(id) as number));
    const ours = percentiles(delays(consumed), [50, 99]);
    const floor = percentiles(delays(read), [50, 99]);
    const missing = stageIds.filter((id) => !consumed.has(id)).length;
    const lastDone = Math.max(...consumed.values());
    const rate = consumed.size / ((lastDone - begin) / 1000);
    return {
      figures: {
        stageEvents: stageIds.length,
        outputPerStage: OUTPUT_PER_STAGE,
        appendSeconds: round(elapsed),
        consumed: consumed.size,
        missing,
        consumedPerSecond: round(rate),
        delayMs: { p50: round(ours.p50 as number), p99: round(ours.p99 as number) },
        bareXreadDelayMs: { p50: round(floor.p50 as number), p99: round(floor.p99 as number) },
      },
      targets: [
        absoluteTarget('stage events consumed, none missing', 'events', consumed.size, { atLeast: stageIds.length }),
        absoluteTarget('append to job written, p50', 'ms', round(ours.p50 as number), { atMost: 50 }, !opts.smoke),
        ratioTarget(
          'append to job written, p99',
          'ms',
          round(ours.p99 as number),
          { name: 'bare XREAD BLOCK, p99', value: round(floor.p99 as number) },
          { atMost: 20 },
          !opts.smoke,
        ),
      ],
      charts: [],
      notes: [
        `${stageIds.length} stage events appended over ${round(elapsed)} s, each after ${OUTPUT_PER_STAGE} stdout events (one append each), on one tenant.`,
        'Delay: from the start of a stage event’s append to the commit of its delivery job (the sink call that carried it resolved); the consumer is woken by the tenant’s live channel.',
        `The bare reader is one XREAD BLOCK loop on the same stream in the same process: the floor for any reader of Redis Streams here.`,
      ],
    };
  },
};
