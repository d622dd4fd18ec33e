/**
 * Webhook delivery on one node, the whole path as production runs it: stage events appended to
 * the event log, read by the webhook consumer through the tenant's consumer group (Redis
 * Streams groups when REDIS_URL is set, else the embedded in-memory groups), made into delivery
 * jobs by the service's sink, sent by one delivery worker to a local HTTPS receiver, each
 * request on a connection of its own (resolve, check, TLS handshake). Measured: deliveries per
 * second, and the delay from the start of a stage event's append to its first delivery attempt
 * arriving (p50/p99).
 *
 * Baseline in the same run and process: "direct", where the appender hands its events to
 * enqueueWebhookJobs itself (no consumer); the report gives consumer/direct ratios. Each mode
 * has its own account and endpoints (the consumer reads only its own account); both append to
 * the same log and share the one worker, one mode after the other.
 *
 * Two phases per mode: a burst (every event at once: throughput) and a paced stream (delay when
 * the worker keeps up). Postgres when DATABASE_URL is set, else a throwaway embedded PostgreSQL. Writes
 * bench/reports/webhook-delivery-<time>.{json,md}. The worker polls every `--interval` ms (the
 * service's WEBHOOK_INTERVAL_MS default) and is woken when jobs are written, as in the service.
 *
 *   [DATABASE_URL=postgres://...] [REDIS_URL=redis://...] npm run bench:webhooks -- \
 *     [--events 200] [--endpoints 5] [--rate 10] [--seconds 5] [--interval 1000] [--smoke] [--out DIR]
 *
 * --smoke: 20 events, 2 endpoints, 1 s paced; --out: the directory the report goes to.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { newId } from '@svc/core';
import { accounts, consumerMarks, migrate, openDatabase } from '@svc/db';
import { Redis } from 'ioredis';
import pino from 'pino';
import { exemptList } from '../../gateway/src/addresses.ts';
import { memoryConsumerGroups } from '../../gateway/src/log/consumer.memory.ts';
import { redisConsumerGroups } from '../../gateway/src/log/consumer.redis.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { redisEventLog } from '../../gateway/src/log/log.redis.ts';
import { fileMailer } from '../../gateway/src/mail/mail.file.ts';
import { Keyring } from '../../gateway/src/secrets/keyring.ts';
import { enqueueWebhookJobs } from '../../gateway/src/services/webhook-jobs.ts';
import { createEndpoint } from '../../gateway/src/services/webhooks.ts';
import { defaultConsumerName, WebhookConsumer } from '../../gateway/src/workers/webhook-consumer.ts';
import { WebhookDeliveryWorker } from '../../gateway/src/workers/webhook-delivery.ts';
import { percentiles, round } from './lib/stats.ts';

const { values } = parseArgs({
  options: {
    events: { type: 'string' },
    endpoints: { type: 'string' },
    rate: { type: 'string' },
    seconds: { type: 'string' },
    interval: { type: 'string', default: '1000' },
    smoke: { type: 'boolean', default: false },
    out: { type: 'string' },
  },
});
// --smoke: 20 events to 2 endpoints and a 1 s paced stream, only proving the script produces
// its report (npm test).
const smoke = values.smoke;
const burstEvents = Number(values.events ?? (smoke ? '20' : '200'));
const endpointCount = Number(values.endpoints ?? (smoke ? '2' : '5'));
const rate = Number(values.rate ?? '10');
const pacedSeconds = Number(values.seconds ?? (smoke ? '1' : '5'));
/** How often the delivery worker looks for due jobs besides being woken (the service's default: 1000 ms). */
const intervalMs = Number(values.interval);
const HOST = 'receiver.test';
const CONCURRENCY = 32;
const PER_ENDPOINT = 4;

const dir = mkdtempSync(join(tmpdir(), 'svc-bench-webhooks-'));
execFileSync(
  'openssl',
  ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'key.pem'].concat([
    '-out',
    'cert.pem',
    '-days',
    '1',
    '-subj',
    `/CN=${HOST}`,
    '-addext',
    `subjectAltName=DNS:${HOST}`,
  ]),
  { cwd: dir, stdio: 'pipe' },
);
const cert = readFileSync(join(dir, 'cert.pem'), 'utf8');
type Mode = 'consumer' | 'direct';
interface Tenant {
  name: string;
  mode: Mode;
  accountId: string;
  /** Event id to the time (performance.now) its append began. */
  appendedAt: Map<string, number>;
  /** Event id to the time its first attempt arrived. */
  arrived: Map<string, number>;
  /** Attempts received, retries included. */
  received: number;
}
/** By the name in the endpoints' paths (/hook/<name>/<i>). */
const tenants = new Map<string, Tenant>();
const receiver = createServer({ cert, key: readFileSync(join(dir, 'key.pem'), 'utf8') }, (req, res) => {
  req.resume();
  req.on('end', () => {
    const tenant = tenants.get((req.url ?? '').split('/')[2] ?? '');
    if (tenant) {
      tenant.received++;
      const id = req.headers['svc-event-id'] as string;
      if (!tenant.arrived.has(id)) tenant.arrived.set(id, performance.now());
    }
    res.end('ok');
  });
});
await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
const port = (receiver.address() as AddressInfo).port;

const db = await openDatabase({ url: process.env.DATABASE_URL ?? 'memory', dataDir: dir, max: 10 });
await migrate(db.sql);
const keyring = new Keyring(randomBytes(32));

/** An account with `endpointCount` endpoints on the receiver, taking every event type. */
async function makeTenant(name: string, mode: Mode): Promise<Tenant> {
  const accountId = newId('acc');
  await accounts.insertAccount(db.sql, {
    id: accountId,
    email: `${accountId}@bench.test`,
    passwordHash: 'x',
    role: 'user',
    dataKey: keyring.newWrappedDataKey(accountId),
  });
  const who = { accountId, actor: 'system' as const, ip: null };
  for (let i = 0; i < endpointCount; i++) {
    await createEndpoint({ sql: db.sql, keyring, allowHttp: false }, who, {
      url: `https://${HOST}:${port}/hook/${name}/${i}`,
      event_types: ['*'],
    });
  }
  const tenant: Tenant = { name, mode, accountId, appendedAt: new Map(), arrived: new Map(), received: 0 };
  tenants.set(name, tenant);
  return tenant;
}

const worker = new WebhookDeliveryWorker(
  {
    sql: db.sql,
    keyring,
    mailer: fileMailer(join(dir, 'mail')),
    logger: pino({ level: 'warn' }),
    now: () => new Date(),
    publicUrl: () => 'http://127.0.0.1',
    transport: { resolve: async () => ['127.0.0.1'], allowed: exemptList(['127.0.0.1/32']), ca: cert },
  },
  { periodMs: intervalMs, concurrency: CONCURRENCY, perEndpoint: PER_ENDPOINT, timeoutMs: 10_000 },
);
worker.start();

const redisUrl = process.env.REDIS_URL;
const redisClients = redisUrl ? [new Redis(redisUrl), new Redis(redisUrl)] : [];
const [redis, subscriber] = redisClients;
const prefix = `bench${randomBytes(3).toString('hex')}:`;
const log = redis && subscriber ? redisEventLog(redis, subscriber, { prefix }) : memoryEventLog();
const groups = redis ? redisConsumerGroups(redis, { prefix }) : memoryConsumerGroups(log);
const direct = await makeTenant('direct', 'direct');
const consumed = await makeTenant('consumer', 'consumer');
// Wired as gateway/src/main.ts wires it (batch, idle, sweep at the service's defaults; jobs
// written wake the worker), but reading only the consumer mode's account: the direct mode's
// events must not be enqueued twice.
const consumer = new WebhookConsumer(
  {
    sql: db.sql,
    log,
    groups,
    sink: async (accountId, events) => {
      if ((await enqueueWebhookJobs(db.sql, accountId, events)) > 0) worker.workArrived();
    },
    tenants: async () => [consumed.accountId],
    since: (accountId) => consumerMarks.endpointsActiveSince(db.sql, accountId),
    logger: pino({ level: 'warn' }),
  },
  { name: defaultConsumerName(), batch: 500, minIdleMs: 30_000, sweepMs: 5000 },
);
await consumer.start();

let seq = 1;
/** Appends `n` stage events to the tenant's log; what follows is the mode's business. */
async function appendStageEvents(tenant: Tenant, n: number): Promise<void> {
  const at = performance.now();
  const result = await log.append({
    tenant: tenant.accountId,
    producer: 'bench',
    seq,
    events: Array.from({ length: n }, () => ({
      conversationId: 'cnv_bench',
      turnId: 'trn_bench',
      kind: 'stage',
      stream: 'stage',
      stage: 'turn',
      state: 'done',
      durationMs: 1,
    })),
  });
  seq += n;
  if (result.status !== 'appended') throw new Error(`append: ${result.status}`);
  for (const e of result.events) tenant.appendedAt.set(String(e.id), at);
  if (tenant.mode === 'direct' && (await enqueueWebhookJobs(db.sql, tenant.accountId, result.events)) > 0) {
    worker.workArrived();
  }
}

async function waitFor(tenant: Tenant, total: number): Promise<void> {
  while (tenant.received < total) await new Promise((r) => setTimeout(r, 5));
}

function delays(tenant: Tenant, ids: string[]) {
  return percentiles(
    ids.map((id) => (tenant.arrived.get(id) as number) - (tenant.appendedAt.get(id) as number)),
    [50, 99],
  );
}

/** Both phases for one mode; the mode's counters start from zero. */
async function measure(tenant: Tenant) {
  // Burst: every event at once; deliveries/s is what the whole path sustains.
  const burstStart = performance.now();
  for (let i = 0; i < burstEvents; i += 100) await appendStageEvents(tenant, Math.min(100, burstEvents - i));
  await waitFor(tenant, burstEvents * endpointCount);
  const burstSeconds = (performance.now() - burstStart) / 1000;
  const burstIds = [...tenant.appendedAt.keys()];
  const burst = {
    deliveries: burstEvents * endpointCount,
    seconds: round(burstSeconds),
    perSecond: Math.round((burstEvents * endpointCount) / burstSeconds),
    delayMs: delays(tenant, burstIds),
  };

  // Paced: `rate` events a second, one at a time; the delay when the worker keeps up.
  const before = tenant.received;
  const pacedCount = rate * pacedSeconds;
  const pacedStart = performance.now();
  for (let i = 0; i < pacedCount; i++) {
    const due = pacedStart + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    await appendStageEvents(tenant, 1);
  }
  await waitFor(tenant, before + pacedCount * endpointCount);
  const pacedIds = [...tenant.appendedAt.keys()].slice(burstIds.length);
  const paced = { events: pacedCount, deliveries: pacedCount * endpointCount, rate, delayMs: delays(tenant, pacedIds) };
  return { burst, paced };
}

// Warm-up through the direct path (not counted): the first mode measured must not pay for
// the JIT, the pools and the first TLS handshakes alone.
const warm = await makeTenant('warmup', 'direct');
for (let i = 0; i < 5; i++) await appendStageEvents(warm, 10);
await waitFor(warm, 50 * endpointCount);

const results = { consumer: await measure(consumed), direct: await measure(direct) };

await consumer.stop();
worker.stop();
await worker.settled();
receiver.close();
await log.close();
for (const r of redisClients) await r.quit();
await db.close();
rmSync(dir, { recursive: true, force: true });

const store = process.env.DATABASE_URL ? 'Postgres' : 'embedded PostgreSQL';
const logStore = redisUrl ? 'Redis Streams log and consumer groups' : 'in-memory log and consumer groups';
const fmt = (x: number | undefined) => (x === undefined ? '-' : round(x, 1));
/** consumer / direct, two decimals. */
const ratio = (a: number | undefined, b: number | undefined) =>
  a === undefined || b === undefined || b === 0 ? '-' : `${round(a / b, 2)}x`;
const { consumer: c, direct: d } = results;
const row = (mode: string, r: typeof c) => [
  `| ${mode} | burst of ${burstEvents} events | ${r.burst.deliveries} | ${r.burst.perSecond} | ${fmt(r.burst.delayMs.p50)} | ${fmt(r.burst.delayMs.p99)} |`,
  `| ${mode} | paced, ${rate} events/s for ${pacedSeconds} s | ${r.paced.deliveries} | - | ${fmt(r.paced.delayMs.p50)} | ${fmt(r.paced.delayMs.p99)} |`,
];
const command = [
  process.env.DATABASE_URL ? 'DATABASE_URL=postgres://…' : '',
  redisUrl ? 'REDIS_URL=redis://…' : '',
  'npm run bench:webhooks',
  ...(process.argv.length > 2 ? ['--', ...process.argv.slice(2)] : []),
]
  .filter(Boolean)
  .join(' ');
const lines = [
  `# Webhook delivery on one node (${new Date().toISOString()})`,
  '',
  `${store}, ${logStore}; one webhook consumer (batch 500) and one delivery worker (woken when jobs are written, else looking every ${intervalMs} ms; ${CONCURRENCY} in flight, ${PER_ENDPOINT} per endpoint), ${endpointCount} endpoints per account on a local HTTPS receiver, a new TLS connection per request; Node ${process.version}.`,
  '',
  "Delay: from the start of a stage event's append to its first attempt arriving at the receiver. consumer: append -> consumer group read -> delivery jobs -> worker -> receiver, as the service runs it. direct (baseline, run after it): the appender writes the jobs itself, no consumer. In the burst the direct appender waits for each 100 events' jobs before appending more, so its events are appended later and its burst delays start later: compare burst deliveries/s and the paced delays.",
  '',
  `Command: \`${command}\``,
  '',
  '| mode | phase | deliveries | deliveries/s | delay p50 (ms) | delay p99 (ms) |',
  '|---|---|---|---|---|---|',
  ...row('consumer', c),
  ...row('direct', d),
  `| consumer / direct | burst | | ${ratio(c.burst.perSecond, d.burst.perSecond)} | ${ratio(c.burst.delayMs.p50, d.burst.delayMs.p50)} | ${ratio(c.burst.delayMs.p99, d.burst.delayMs.p99)} |`,
  `| consumer / direct | paced | | | ${ratio(c.paced.delayMs.p50, d.paced.delayMs.p50)} | ${ratio(c.paced.delayMs.p99, d.paced.delayMs.p99)} |`,
];
const report = lines.join('\n');
process.stdout.write(`${report}\n`);
const out = values.out ?? join(fileURLToPath(new URL('../../', import.meta.url)), 'bench/reports');
mkdirSync(out, { recursive: true });
const stamp = new Date().toISOString().replace(/[:.]/g, '-');
writeFileSync(
  join(out, `webhook-delivery-${stamp}.json`),
  `${JSON.stringify({ command, store, log: logStore, intervalMs, endpointCount, ...results }, null, 2)}\n`,
);
writeFileSync(join(out, `webhook-delivery-${stamp}.md`), `${report}\n`);
