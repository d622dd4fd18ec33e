import { spawn } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { exemptList } from '../../gateway/src/addresses.ts';
import { WebhookDeliveryWorker } from '../../gateway/src/workers/webhook-delivery.ts';
import { collectOutput } from './child-output.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { alive } from './runner-process.ts';
import { until } from './until.ts';
import { type Answer, startReceiver } from './webhook-receiver.ts';

const WORKER = fileURLToPath(new URL('./fixtures/webhook-worker.ts', import.meta.url));
const HOST = 'receiver.test';

// A worker in another process needs the database a server holds: the Postgres backend only.
t.test(
  'a delivery worker killed with SIGKILL mid-burst: every job is still delivered',
  { skip: !backends().includes('postgres+redis') && 'needs the Postgres of the run' },
  async (t) => {
    const svc = await startTestService(t, { backend: 'postgres+redis', env: { WEBHOOK_INTERVAL_MS: '0' } });
    const me = await signUp(svc);
    let answer: Answer = 'hold';
    const receiver = await startReceiver(t, HOST, () => answer);
    const caFile = join(svc.dataDir, 'receiver-ca.pem');
    await writeFile(caFile, receiver.ca);
    const made = await svc.http.post('/api/webhooks', {
      token: me.key,
      body: { url: `https://${HOST}:${receiver.port}/hook` },
    });
    t.equal(made.status, 201, made.text);
    const events: string[] = [];
    for (let i = 0; i < 10; i++) {
      events.push((await svc.http.post(`/api/webhooks/${made.body.id}/test`, { token: me.key })).body.event);
    }

    const child = spawn(process.execPath, ['--import', 'tsx', '--conditions=svc-workspace', WORKER], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        DATABASE_URL: svc.config.DATABASE_URL,
        MASTER_KEY: svc.config.MASTER_KEY,
        MAIL_DIR: svc.mailDir,
        WEBHOOK_TEST_HOST: HOST,
        WEBHOOK_TEST_CA: caFile,
        WEBHOOK_TEST_PER_ENDPOINT: '4',
      },
    });
    const output = collectOutput(child);
    t.teardown(() => {
      if (alive(child.pid)) child.kill('SIGKILL');
    });
    await until('the worker process to hold four requests open', () => receiver.held === 4, 30_000).catch((err) => {
      throw new Error(`${err.message}\n${output.both()}`);
    });
    const inFlight = receiver.received.map((r) => r.headers['svc-event-id'] as string);
    child.kill('SIGKILL');
    await until('the worker process to die', () => child.exitCode !== null || child.signalCode !== null);
    t.equal(child.signalCode, 'SIGKILL');
    answer = { status: 200, body: 'ok' };
    receiver.release({ status: 200 });

    // Another worker, once the dead one's leases (six request timeouts) have expired.
    const clock = new Date(Date.now() + 60_000);
    const worker = new WebhookDeliveryWorker(
      {
        sql: svc.db.sql,
        keyring: svc.keyring,
        mailer: svc.mailer,
        logger: svc.log,
        now: () => clock,
        publicUrl: () => svc.url,
        transport: { resolve: async () => ['127.0.0.1'], allowed: exemptList(['127.0.0.1/32']), ca: receiver.ca },
      },
      { periodMs: 0, concurrency: 8, perEndpoint: 4, timeoutMs: 5000 },
    );
    for (;;) {
      const started = await worker.pass();
      await worker.settled();
      if (started === 0) break;
    }
    const rows = (await svc.http.get(`/api/webhooks/${made.body.id}/deliveries?limit=200`, { token: me.key })).body
      .data as { event: string; result: number | null }[];
    t.same(rows.map((r) => r.event).sort(), [...events].sort(), 'every event has exactly one recorded attempt');
    t.ok(
      rows.every((r) => r.result === 200),
      'each accepted',
    );
    for (const id of inFlight) {
      t.ok(
        receiver.received.filter((r) => r.headers['svc-event-id'] === id).length >= 2,
        `${id}, in flight when the worker died, was sent again`,
      );
    }
    for (const id of events) {
      t.ok(
        receiver.received.some((r) => r.headers['svc-event-id'] === id),
        `${id} reached the receiver at least once`,
      );
    }
  },
);
