/**
 * Webhook delivery on one node: deliveries per second to a local HTTPS receiver, and the delay
 * from a stage event's append to its first delivery attempt arriving (p50/p99). Stage events
 * are appended to the in-memory log and handed to enqueueWebhookJobs at once (standing in for
 * the log consumer, whose own lag is not counted); one delivery worker sends them, each
 * request on a connection of its own (resolve, check, TLS handshake), as in production.
 * Two phases: a burst (every event at once: throughput) and a paced stream (delay when the
 * worker keeps up). Postgres when DATABASE_URL is set, else embedded PGlite. Writes
 * bench/reports/webhook-delivery-<time>.{json,md}.
 *
 *   DATABASE_URL=postgres://... npm run bench:webhooks -- [--events 2000] [--endpoints 20] [--rate 100]
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
import { accounts, migrate, openDatabase } from '@svc/db';
import pino from 'pino';
import { exemptList } from '../../gateway/src/edge/client-ip.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { fileMailer } from '../../gateway/src/mail/mail.file.ts';
import { Keyring } from '../../gateway/src/secrets/keyring.ts';
import { enqueueWebhookJobs } from '../../gateway/src/services/webhook-jobs.ts';
import { createEndpoint } from '../../gateway/src/services/webhooks.ts';
import { WebhookDeliveryWorker } from '../../gateway/src/workers/webhook-delivery.ts';
import { percentiles, round } from './lib/stats.ts';

const { values } = parseArgs({
  options: {
    events: { type: 'string', default: '2000' },
    endpoints: { type: 'string', default: '20' },
    rate: { type: 'string', default: '100' },
    seconds: { type: 'string', default: '10' },
  },
});
const burstEvents = Number(values.events);
const endpointCount = Number(values.endpoints);
const rate = Number(values.rate);
const pacedSeconds = Number(values.seconds);
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
/** Event id to the wall time (ms) its first attempt arrived. */
const arrived = new Map<string, number>();
let received = 0;
const receiver = createServer({ cert, key: readFileSync(join(dir, 'key.pem'), 'utf8') }, (req, res) => {
  req.resume();
  req.on('end', () => {
    received++;
    const id = req.headers['svc-event-id'] as string;
    if (!arrived.has(id)) arrived.set(id, performance.now());
    res.end('ok');
  });
});
await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
const port = (receiver.address() as AddressInfo).port;

const db = await openDatabase({ url: process.env.DATABASE_URL ?? 'memory', dataDir: dir, max: 10 });
await migrate(db.sql);
const keyring = new Keyring(randomBytes(32));
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
    url: `https://${HOST}:${port}/hook/${i}`,
    event_types: ['*'],
  });
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
  { periodMs: 20, concurrency: CONCURRENCY, perEndpoint: PER_ENDPOINT, timeoutMs: 10_000 },
);
worker.start();

const log = memoryEventLog();
let seq = 1;
/** Event id to the time (performance.now) it was appended. */
const appendedAt = new Map<string, number>();
async function appendStageEvents(n: number): Promise<void> {
  const result = await log.append({
    tenant: accountId,
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
  const at = performance.now();
  if (result.status !== 'appended') throw new Error(`append: ${result.status}`);
  for (const e of result.events) appendedAt.set(String(e.id), at);
  await enqueueWebhookJobs(db.sql, accountId, result.events);
}

async function waitFor(total: number): Promise<void> {
  while (received < total) await new Promise((r) => setTimeout(r, 5));
}

function delays(ids: string[]) {
  return percentiles(
    ids.map((id) => (arrived.get(id) as number) - (appendedAt.get(id) as number)),
    [50, 99],
  );
}

// Burst: every event at once; deliveries/s is what the worker sustains.
const burstStart = performance.now();
for (let i = 0; i < burstEvents; i += 100) await appendStageEvents(Math.min(100, burstEvents - i));
await waitFor(burstEvents * endpointCount);
const burstSeconds = (performance.now() - burstStart) / 1000;
const burstIds = [...appendedAt.keys()];
const burst = {
  deliveries: burstEvents * endpointCount,
  seconds: round(burstSeconds),
  perSecond: Math.round((burstEvents * endpointCount) / burstSeconds),
  delayMs: delays(burstIds),
};

// Paced: `rate` events a second, one at a time; the delay when the worker keeps up.
const before = received;
const pacedIds: string[] = [];
const pacedCount = rate * pacedSeconds;
const pacedStart = performance.now();
for (let i = 0; i < pacedCount; i++) {
  const due = pacedStart + (i * 1000) / rate;
  const wait = due - performance.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  const known = new Set(appendedAt.keys());
  await appendStageEvents(1);
  for (const id of appendedAt.keys()) if (!known.has(id)) pacedIds.push(id);
}
await waitFor(before + pacedCount * endpointCount);
const paced = { events: pacedCount, rate, delayMs: delays(pacedIds) };

worker.stop();
await worker.settled();
receiver.close();
await db.close();
rmSync(dir, { recursive: true, force: true });

const store = process.env.DATABASE_URL ? 'Postgres' : 'embedded PGlite';
const fmt = (x: number | undefined) => (x === undefined ? '-' : round(x, 1));
const lines = [
  `# Webhook delivery on one node (${new Date().toISOString()})`,
  '',
  `${store}; one delivery worker (${CONCURRENCY} in flight, ${PER_ENDPOINT} per endpoint), ${endpointCount} endpoints on a local HTTPS receiver, a new TLS connection per request; Node ${process.version}. Delay: from the stage event's append to its first attempt arriving (jobs written at once, standing in for the log consumer).`,
  '',
  '| phase | deliveries | deliveries/s | delay p50 (ms) | delay p99 (ms) |',
  '|---|---|---|---|---|',
  `| burst of ${burstEvents} events | ${burst.deliveries} | ${burst.perSecond} | ${fmt(burst.delayMs.p50)} | ${fmt(burst.delayMs.p99)} |`,
  `| paced, ${rate} events/s for ${pacedSeconds} s | ${pacedCount * endpointCount} | - | ${fmt(paced.delayMs.p50)} | ${fmt(paced.delayMs.p99)} |`,
];
const report = lines.join('\n');
process.stdout.write(`${report}\n`);
const out = join(fileURLToPath(new URL('../../', import.meta.url)), 'bench/reports');
mkdirSync(out, { recursive: true });
const stamp = new Date().toISOString().replace(/[:.]/g, '-');
writeFileSync(
  join(out, `webhook-delivery-${stamp}.json`),
  `${JSON.stringify({ store, endpointCount, burst, paced }, null, 2)}\n`,
);
writeFileSync(join(out, `webhook-delivery-${stamp}.md`), `${report}\n`);
