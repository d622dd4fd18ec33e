import { spawn } from 'node:child_process';
import { readdir } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { gunzipSync } from 'node:zlib';
import { exports as exportRows } from '@svc/db';
import t from 'tap';
import { ExportFiles } from '../../gateway/src/services/exports.ts';
import { ExportBuilder } from '../../gateway/src/workers/export-builder.ts';
import { collectOutput } from './child-output.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { alive } from './runner-process.ts';
import { until } from './until.ts';

const WORKER = fileURLToPath(new URL('./fixtures/export-worker.ts', import.meta.url));
const LEASE_MS = 2 * 60_000;

// A worker in another process needs the database and Redis a server holds: that backend only.
t.test(
  'an export worker process killed with SIGKILL mid-build: another builds the file whole',
  { skip: !backends().includes('postgres+redis') && 'needs the Postgres and Redis of the run' },
  async (t) => {
    const svc = await startTestService(t, { backend: 'postgres+redis', env: { EXPORT_WORKER_INTERVAL_MS: '0' } });
    const me = await signUp(svc);
    const token = me.key;
    // Three pages of events (a page is 1,000), so the build is under way after the first.
    const lines = Array.from({ length: 2500 }, (_, i) => `line ${i}`);
    for (let i = 0; i < lines.length; i += 500) {
      await svc.appendEvents({
        tenant: me.accountId,
        producer: 'bulk',
        seq: i + 1,
        events: lines
          .slice(i, i + 500)
          .map((data) => ({ conversationId: null, kind: 'output', stream: 'stdout', data })),
      });
    }
    const id = (await svc.http.post('/api/account/exports', { token })).body.id as string;

    const child = spawn(process.execPath, ['--import', 'tsx', '--conditions=svc-workspace', WORKER], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        DATABASE_URL: svc.config.DATABASE_URL,
        REDIS_URL: svc.config.REDIS_URL,
        REDIS_KEY_PREFIX: svc.config.REDIS_KEY_PREFIX,
        DATA_DIR: svc.dataDir,
        EXPORT_LEASE_MS: String(LEASE_MS),
        EXPORT_STALL_AFTER_PAGES: '1',
      },
    });
    const output = collectOutput(child);
    t.teardown(() => {
      if (alive(child.pid)) child.kill('SIGKILL');
    });
    await until(
      'the worker process to write its first page',
      () => output.both().includes('{"pages":1}'),
      60_000,
    ).catch((err) => {
      throw new Error(`${err.message}\n${output.both()}`);
    });
    const building = (await svc.http.get(`/api/account/exports/${id}`, { token })).body;
    t.match(building, { status: 'pending', downloadable: false, progress: { events_written: 1000 } });
    const files = new ExportFiles(svc.dataDir);
    t.same(await readdir(files.dirOf(me.accountId)), [`${id}.1.part`], 'the worker process is writing its part file');

    child.kill('SIGKILL');
    await until('the worker process to die', () => child.exitCode !== null || child.signalCode !== null);
    t.equal(child.signalCode, 'SIGKILL');
    t.equal((await svc.http.get(`/api/account/exports/${id}/download`, { token })).status, 404, 'nothing to download');

    const worker = (now: () => Date) =>
      new ExportBuilder(
        { sql: svc.db.sql, log: svc.eventLog, files, logger: svc.log, now },
        { periodMs: 0, leaseMs: LEASE_MS },
      );
    t.equal(await worker(() => new Date()).pass(), 0, 'the dead worker’s lease holds it until it expires');
    t.equal(await worker(() => new Date(Date.now() + LEASE_MS + 60_000)).pass(), 1, 'then another builds it');

    const ready = (await svc.http.get(`/api/account/exports/${id}`, { token })).body;
    t.match(ready, { status: 'ready', downloadable: true, progress: { events_written: 2500 } });
    t.same(await readdir(files.dirOf(me.accountId)), [`${id}.json.gz`], 'the killed worker’s part file is gone');
    const res = await fetch(`${svc.url}/api/account/exports/${id}/download`, {
      headers: { authorization: `Bearer ${token}` },
    });
    t.equal(res.status, 200);
    const doc = JSON.parse(gunzipSync(Buffer.from(await res.arrayBuffer())).toString('utf8'));
    t.match(doc, { format: 'svc-export', version: 1, account_id: me.accountId });
    for (const section of Object.keys(exportRows.EXPORT_SECTIONS)) {
      t.ok(Array.isArray(doc[section]), `the file holds ${section}`);
    }
    t.same(
      (doc.events as { data: string }[]).map((e) => e.data),
      lines,
      'every event once, in order',
    );
  },
);
