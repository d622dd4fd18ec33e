import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
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

/** A port nobody listens on now, from the kernel (the server takes it right after). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

/**
 * Resolves once the redis-server on `port` answers PING; rejects with why when `server` exits
 * first (its port taken meanwhile, say) or 30 s pass (a loaded machine is slow, not broken).
 */
async function waitUp(port: number, server: ChildProcess) {
  let exited: string | undefined;
  server.once('exit', (code, signal) => {
    exited = signal ?? `code ${code}`;
  });
  for (const deadline = Date.now() + 30_000; Date.now() < deadline; ) {
    if (exited) throw new Error(`redis-server on port ${port} exited (${exited}) before it answered`);
    try {
      execFileSync('redis-cli', ['-p', String(port), 'ping'], { stdio: 'pipe' });
      return;
    } catch {
      await sleep(50);
    }
  }
  throw new Error(`redis-server on port ${port} did not answer within 30 s`);
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
  let port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), `svc-${label}-`));
  let server: ChildProcess | undefined;
  t.teardown(() => {
    server?.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });
  const own: OwnRedis = {
    get port() {
      return port;
    },
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
      await waitUp(port, server);
    },
  };
  // The first start may find its port taken between the probe and the bind: another one, then.
  for (let attempt = 1; ; attempt++) {
    try {
      await own.start();
      return own;
    } catch (err) {
      if (attempt === 3 || !/exited/.test((err as Error).message)) throw err;
      port = await freePort();
    }
  }
}
