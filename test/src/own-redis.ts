import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Whether this machine can run a redis-server of a test's own. */
export function haveRedis(): boolean {
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Resolves once the redis-server on `port` answers PING. */
async function waitUp(port: number) {
  for (let i = 0; i < 100; i++) {
    try {
      execFileSync('redis-cli', ['-p', String(port), 'ping'], { stdio: 'pipe' });
      return;
    } catch {
      await sleep(50);
    }
  }
  throw new Error('redis did not come up');
}

export interface OwnRedis {
  port: number;
  /** Its data directory (appendonly, fsync always), kept across `stop` and `start`. */
  dir: string;
  /** Stops the server with `signal` and resolves once it has exited. */
  stop(signal: NodeJS.Signals): Promise<void>;
  /** Starts it again on the same port and directory; resolves once it answers. */
  start(): Promise<void>;
}

/**
 * A redis-server of one test's own, so stopping or restarting it disturbs nobody else.
 * Resolves once it answers; killed and its directory removed when `t` ends.
 */
export async function ownRedisServer(t: Test, label: string): Promise<OwnRedis> {
  const port = 21000 + Math.floor(Math.random() * 20000);
  const dir = mkdtempSync(join(tmpdir(), `svc-${label}-`));
  let server: ChildProcess | undefined;
  t.teardown(() => {
    server?.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });
  const own: OwnRedis = {
    port,
    dir,
    async stop(signal) {
      const exited = new Promise((r) => server?.once('exit', r));
      server?.kill(signal);
      await exited;
    },
    async start() {
      server = spawn(
        'redis-server',
        [
          ...['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', ''],
          ...['--appendonly', 'yes', '--appendfsync', 'always', '--maxmemory-policy', 'noeviction'],
        ],
        { stdio: 'ignore' },
      );
      await waitUp(port);
    },
  };
  await own.start();
  return own;
}
