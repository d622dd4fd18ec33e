import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensurePackages } from './apt.ts';
import { freePort, type Started, startProcess } from './proc.ts';

export interface ThrowawayRedis {
  url: string;
  port: number;
  pid: number;
  stop(): Promise<void>;
}

/** A redis-server on a free loopback port, no persistence, gone when stopped. */
export async function startRedis(
  extra: string[] = [],
  say: (s: string) => void = (s) => process.stderr.write(`${s}\n`),
): Promise<ThrowawayRedis> {
  ensurePackages(['redis-server'], say);
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'svc-bench-redis-'));
  const started: Started = await startProcess(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...extra],
    { ready: /Ready to accept connections/, name: 'redis-server' },
  );
  return { url: `redis://127.0.0.1:${port}`, port, pid: started.child.pid as number, stop: started.stop };
}
