/**
 * An account export of a big tenant: fills one account with `--events` log events (default
 * 100,000; output lines of ~190 bytes of random hex across 100 conversations) on a throwaway PostgreSQL,
 * waits until the worker has copied them to Postgres (the hot tail keeps the last
 * LOG_HOT_EVENTS), then builds the export with the service's own worker and reports the time,
 * the file's size, and the process's peak RSS and V8 heap growth over what they were just
 * before the build (sampled every 10 ms, after a full GC), and the heap still held after the
 * build and a GC, next to the uncompressed size of the JSON it wrote. The script runs with the
 * old generation capped at 256 MB (package.json), so an export held whole would fail with an
 * out-of-memory error as the account grows; a streamed one finishes with a heap growth that
 * does not follow the account's size (compare `--events 100000` and `--events 300000`).
 *
 *   npm run bench:export -- [--events 100000] [--smoke] [--out DIR]
 *
 * Writes bench/reports/export-<time>.{json,md} (or into --out). --smoke: 2,000 events.
 */
import { randomBytes } from 'node:crypto';
import { createReadStream, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import v8 from 'node:v8';
import { createGunzip } from 'node:zlib';
import { conversations, exports as exportRows } from '@svc/db';
import { loadConfig } from '../../gateway/src/config.ts';
import { createLogger, startService } from '../../gateway/src/main.ts';
import { ExportFiles, requestExport } from '../../gateway/src/services/exports.ts';
import { ExportBuilder } from '../../gateway/src/workers/export-builder.ts';
import { startPostgres } from './lib/postgres.ts';
import { signUp } from './tenant.ts';

const { values } = parseArgs({
  options: { events: { type: 'string' }, smoke: { type: 'boolean', default: false }, out: { type: 'string' } },
});
// --smoke: a small account, only proving the script produces its report (npm test).
const total = Number(values.events ?? (values.smoke ? '2000' : '100000'));
const BATCH = 500;
const CONVERSATIONS = 100;
const say = (s: string) => process.stdout.write(`${s}\n`);
const conversationOf = (c: number) => `cnv_bench_${String(c).padStart(4, '0')}`;
const mb = (bytes: number) => Math.round((bytes / 1024 / 1024) * 10) / 10;

/** Bytes of the gunzipped file, counted as it streams. */
async function gunzippedSize(path: string): Promise<number> {
  let n = 0;
  for await (const chunk of createReadStream(path).pipe(createGunzip())) n += (chunk as Buffer).length;
  return n;
}

const pg = await startPostgres(say);
try {
  const dataDir = mkdtempSync(join(tmpdir(), 'svc-bench-export-'));
  const config = loadConfig({
    PORT: '0',
    DATABASE_URL: pg.url,
    DATA_DIR: dataDir,
    RATE_LIMIT_PER_MINUTE: '0',
    EXPORT_WORKER_INTERVAL_MS: '0',
    LOG_LEVEL: 'warn',
    MASTER_KEY: randomBytes(32).toString('hex'),
  });
  const svc = await startService(config, createLogger('warn'));
  const me = await signUp(svc);
  // The copy stores only events of conversations that exist.
  for (let c = 0; c < CONVERSATIONS; c++) {
    await conversations.insertConversation(svc.db.sql, {
      id: conversationOf(c),
      accountId: me.accountId,
      agentId: 'agt_bench',
      title: `bench ${c}`,
      source: 'ui',
    });
  }
  const fillStarted = performance.now();
  for (let i = 0; i < total; i += BATCH) {
    const events = Array.from({ length: Math.min(BATCH, total - i) }, (_, j) => ({
      conversationId: conversationOf((i + j) % CONVERSATIONS),
      kind: 'output',
      stream: 'stdout',
      data: `${i + j} ${randomBytes(90).toString('hex')}`,
    }));
    const r = await svc.appendEvents({ tenant: me.accountId, producer: 'bench', seq: i + 1, events });
    if (r.status !== 'appended') throw new Error(`append answered ${r.status}`);
  }
  await svc.copier.copyTenant(me.accountId);
  while ((await svc.copier.lag(me.accountId)) !== null) await svc.copier.copyTenant(me.accountId);
  const fillSeconds = (performance.now() - fillStarted) / 1000;
  const [stored] = await svc.db.sql<
    { n: string }[]
  >`SELECT count(*)::text AS n FROM log_events WHERE account_id = ${me.accountId}`;
  say(`filled ${total} events in ${fillSeconds.toFixed(1)} s (${stored?.n} copied to Postgres)`);

  const files = new ExportFiles(dataDir);
  const builder = new ExportBuilder(
    { sql: svc.db.sql, log: svc.eventLog, files, logger: svc.log, now: () => new Date() },
    { periodMs: 0, leaseMs: 120_000 },
  );
  const principal = { accountId: me.accountId, actor: 'api', ip: null } as unknown as Parameters<
    typeof requestExport
  >[1];
  const requested = await requestExport(svc.db.sql, principal, new Date());

  global.gc?.();
  const baseline = process.memoryUsage().rss;
  let peak = baseline;
  let peakHeap = process.memoryUsage().heapUsed;
  const heapBefore = peakHeap;
  const sampler = setInterval(() => {
    const m = process.memoryUsage();
    peak = Math.max(peak, m.rss);
    peakHeap = Math.max(peakHeap, m.heapUsed);
  }, 10);
  const started = performance.now();
  const built = await builder.pass();
  const seconds = (performance.now() - started) / 1000;
  clearInterval(sampler);
  peak = Math.max(peak, process.memoryUsage().rss);
  if (built !== 1) throw new Error('the export was not built');
  global.gc?.();
  const heapAfterGc = process.memoryUsage().heapUsed;

  const row = await exportRows.getExport(svc.db.sql, me.accountId, requested.id);
  const path = files.fileOf(me.accountId, requested.id);
  const json = await gunzippedSize(path);
  const result = {
    events: total,
    events_written: row?.events_written,
    seconds: Math.round(seconds * 100) / 100,
    events_per_second: Math.round(total / seconds),
    file_mb: mb(row?.bytes ?? 0),
    json_mb: mb(json),
    rss_before_mb: mb(baseline),
    heap_before_mb: mb(heapBefore),
    max_old_space_mb: mb(v8.getHeapStatistics().heap_size_limit),
    rss_peak_growth_mb: mb(peak - baseline),
    heap_peak_growth_mb: mb(peakHeap - heapBefore),
    heap_retained_after_gc_mb: mb(heapAfterGc - heapBefore),
    cpus: cpus().length,
    node: process.version,
  };
  say(JSON.stringify(result, null, 2));
  await svc.close();

  const stamp = new Date().toISOString().replaceAll(':', '-').replace('.', '-');
  const dir = values.out ?? fileURLToPath(new URL('../reports/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, `export-${stamp}.json`), `${JSON.stringify(result, null, 2)}\n`);
  writeFileSync(
    join(dir, `export-${stamp}.md`),
    [
      `# Export of a ${total.toLocaleString('en')}-event account`,
      '',
      `Node ${result.node}, ${result.cpus} cores, PostgreSQL (throwaway), in-memory hot log, heap limit ${result.max_old_space_mb} MB.`,
      '',
      '| events | time | events/s | file (gzip) | JSON | RSS before | peak RSS growth | peak heap growth | heap held after |',
      '|---|---|---|---|---|---|---|---|---|',
      `| ${total} | ${result.seconds} s | ${result.events_per_second} | ${result.file_mb} MB | ${result.json_mb} MB | ${result.rss_before_mb} MB | ${result.rss_peak_growth_mb} MB | ${result.heap_peak_growth_mb} MB | ${result.heap_retained_after_gc_mb} MB |`,
      '',
    ].join('\n'),
  );
} finally {
  await pg.stop();
}
