import { mkdir, readdir, readFile, readlink, unlink, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import { processRunning } from '@svc/core';
import type { Logger } from 'pino';

/**
 * What stops a start because another instance holds its data directory or its port. `npm start`
 * prints the message and exits with EXIT_IN_USE (EX_TEMPFAIL: try again once the other stops).
 */
export class InUseError extends Error {}

export const EXIT_IN_USE = 75;

/** The lock file in DATA_DIR: the holder's pid and a newline. */
export const LOCK_FILE = 'svc.lock';

export interface DataDirLock {
  /** Removes the lock file, if it still names this process. */
  release(): Promise<void>;
}

/**
 * Takes DATA_DIR for this process: two processes on one embedded database would each see only
 * their own writes, and one's would be lost at the next start. The lock file is created
 * exclusively; one naming a live process refuses the start (InUseError naming the pid), one
 * naming a process that is gone (killed, crashed) is taken over, and that is logged.
 */
export async function lockDataDir(dataDir: string, log: Logger): Promise<DataDirLock> {
  await mkdir(dataDir, { recursive: true });
  const file = resolve(dataDir, LOCK_FILE);
  const mine = `${process.pid}\n`;
  for (let attempt = 0; ; attempt++) {
    try {
      await writeFile(file, mine, { flag: 'wx' });
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const text = await readFile(file, 'utf8').catch(() => '');
    const holder = Number.parseInt(text, 10);
    if (Number.isInteger(holder) && holder > 0 && processRunning(holder)) {
      throw new InUseError(
        `DATA_DIR ${resolve(dataDir)} is in use by another svc instance (pid ${holder}; lock file ${file}).\n` +
          'Stop that instance first, or give this one its own DATA_DIR.',
      );
    }
    // Two starts taking over one stale lock: each removes it and retries the exclusive create,
    // which only one wins; the other then finds the winner alive.
    if (attempt > 2) throw new InUseError(`could not take the lock file ${file}; remove it if no svc instance runs`);
    log.warn({ file, pid: holder || null }, `taking over DATA_DIR's lock from pid ${holder || '?'}, which is gone`);
    await unlink(file).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }
  return {
    async release() {
      const text = await readFile(file, 'utf8').catch(() => '');
      if (text === mine) await unlink(file).catch(() => {});
    },
  };
}

/**
 * True when nothing may bind `host:port` without SO_REUSEPORT: a listener there (any program,
 * or another svc edge, which binds with SO_REUSEPORT) makes this plain bind fail EADDRINUSE.
 */
export function portTaken(host: string, port: number): Promise<boolean> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE') resolve(true);
      else reject(err);
    });
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve(false)));
  });
}

/**
 * The pids of processes listening on TCP `port`, as far as this process may see (Linux /proc;
 * other users' processes stay hidden unless run as root). Empty when unknown.
 */
export async function portHolders(port: number): Promise<number[]> {
  const inodes = new Set<string>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    const text = await readFile(table, 'utf8').catch(() => '');
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      const local = cols[1];
      // State 0A is LISTEN; the local address ends in the port in hex.
      if (local && cols[3] === '0A' && Number.parseInt(local.split(':')[1] ?? '', 16) === port && cols[9]) {
        inodes.add(`socket:[${cols[9]}]`);
      }
    }
  }
  if (!inodes.size) return [];
  const pids: number[] = [];
  for (const entry of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(entry)) continue;
    const fds = await readdir(join('/proc', entry, 'fd')).catch(() => [] as string[]);
    for (const fd of fds) {
      const target = await readlink(join('/proc', entry, 'fd', fd)).catch(() => '');
      if (inodes.has(target)) {
        pids.push(Number(entry));
        break;
      }
    }
  }
  return pids;
}

/** The refusal for a port another instance (or program) listens on, naming it when known. */
export async function portInUse(host: string, port: number): Promise<InUseError> {
  const pids = (await portHolders(port)).filter((pid) => pid !== process.pid);
  const who = pids.length ? `pid ${pids.join(', ')}` : 'another process';
  return new InUseError(
    `port ${port} on ${host} is in use by ${who}.\n` +
      'Stop the other instance first, or set PORT to a free port (several processes share a port only through EDGE_PROCESSES).',
  );
}
