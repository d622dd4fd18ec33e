/**
 * A bench target: the service on embedded storage (or what BENCH_CONFIG names: REDIS_URL,
 * EDGE=false, ...), rate limit off, logging silent. Run it with `fork` (lib/ours.ts): it
 * sends `{type: 'ready', url, port}` when listening and answers calls `{id, op, args}` where
 * `op` is `<module>#<export>` of the modules listed below, called with the service and `args`.
 * That is how a scenario makes its accounts and conversations and appends inside the target's
 * process.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger, loadConfig, startService } from '@svc/gateway';

const overrides = JSON.parse(process.env.BENCH_CONFIG ?? '{}') as Record<string, string>;
const config = loadConfig({
  PORT: '0',
  DATABASE_URL: 'memory',
  DATA_DIR: mkdtempSync(join(tmpdir(), 'svc-bench-')),
  MASTER_KEY: randomBytes(32).toString('hex'),
  RATE_LIMIT_PER_MINUTE: '0',
  LOG_LEVEL: 'silent',
  SSE_IDLE_CLOSE_MS: '0',
  ...overrides,
});
const service = await startService(config, createLogger(config.LOG_LEVEL));

/**
 * The modules a call may name, as literal imports: so a build of this file (lib/ours.ts runs
 * bench/dist/serve.mjs when it is current) holds them too.
 */
const modules: Record<string, () => Promise<Record<string, unknown>>> = {
  'ops/crud': () => import('./ops/crud.ts'),
  'ops/fanout': () => import('./ops/fanout.ts'),
  'ops/gc': () => import('./ops/gc.ts'),
  'ops/memory': () => import('./ops/memory.ts'),
  'ops/profile': () => import('./ops/profile.ts'),
  'ops/replay': () => import('./ops/replay.ts'),
  'ops/runners': () => import('./ops/runners.ts'),
  tenant: () => import('./tenant.ts'),
};

interface Call {
  id: number;
  op: string;
  args: unknown;
}

process.on('message', (m: Call) => {
  void (async () => {
    try {
      const [file, name] = m.op.split('#') as [string, string];
      const load = modules[file];
      if (!load) throw new Error(`no module ${file} (serve.ts lists the modules a call may name)`);
      const fn = (await load())[name] as ((svc: typeof service, args: unknown) => Promise<unknown>) | undefined;
      if (typeof fn !== 'function') throw new Error(`no export ${name} in ${file}`);
      process.send?.({ id: m.id, result: await fn(service, m.args) });
    } catch (err) {
      process.send?.({ id: m.id, error: (err as Error).stack ?? String(err) });
    }
  })();
});
process.send?.({ type: 'ready', url: service.url, port: service.port });
process.on('SIGTERM', () => {
  void service.close().then(() => process.exit(0));
});
// A target outliving its bench is a leak: go when the parent does.
process.on('disconnect', () => {
  void service.close().then(() => process.exit(0));
});
