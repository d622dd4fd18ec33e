/**
 * `npm start` as a user runs it, in processes of its own, and what tests need to look at those
 * processes from outside: their tree in /proc, whether one is gone, whether the port accepts.
 */
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { processRunning } from '@svc/core';
import type { Test } from 'tap';
import { collectOutput } from './child-output.ts';
import { PASSWORD, tokenFrom, uniqueEmail, waitForMail } from './harness.ts';
import { until } from './until.ts';

const root = join(import.meta.dirname, '..', '..');

/** Whether a process is gone (a zombie nobody reaped counts as gone: it runs nothing). */
export function gone(pid: number): boolean {
  return !processRunning(pid);
}

/**
 * The pid of a zombie: a child that ends a second after its shell became `sleep`, which never
 * collects it, for the test's length. What a killed process is until init gets to it. Run as
 * root, `as` names the user it runs as.
 */
export async function zombie(t: Test, as?: { uid: number; gid: number }): Promise<number> {
  const parent = spawn('/bin/sh', ['-c', 'sleep 1 & echo $!; exec sleep 600'], {
    stdio: ['ignore', 'pipe', 'ignore'],
    ...(as && process.getuid?.() === 0 ? { uid: as.uid, gid: as.gid } : {}),
  });
  t.teardown(() => parent.kill('SIGKILL'));
  let out = '';
  parent.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const pid = await until('the shell to name its child', () => Number(/^(\d+)\n/.exec(out)?.[1]) || undefined, 10_000);
  await until('the child to be a zombie', () => gone(pid) && existsSync(`/proc/${pid}`), 10_000);
  return pid;
}

/**
 * The fields of /proc/<pid>/stat after the command (which may hold spaces and parentheses):
 * [state, ppid, pgrp, ...]. Throws when the process is gone.
 */
function statFields(pid: number | string): string[] {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** The process group of `pid`. */
export function groupOf(pid: number): number {
  return Number(statFields(pid)[2]);
}

/** Every process below `pid`, read from /proc. */
export function descendants(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const ppid = Number(statFields(entry)[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {} // exited meanwhile
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const c of children.get(p) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

export function argv(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

export function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(port, '127.0.0.1');
    sock.once('connect', () => {
      sock.destroy();
      resolve(true);
    });
    sock.once('error', () => resolve(false));
  });
}

export interface NpmStartOptions {
  /** The data directory to start on (kept); a temporary one, removed at the end, when unset. */
  dataDir?: string;
  /** A process group of its own (npm leads it), so a test can kill the whole group. */
  group?: boolean;
  env?: Record<string, string>;
}

/** `npm start` on embedded storage; resolves once it listens. */
export async function npmStart(t: Test, options: NpmStartOptions = {}) {
  let dataDir = options.dataDir;
  if (!dataDir) {
    const made = await mkdtemp(join(tmpdir(), 'svc-test-shutdown-'));
    t.teardown(() => rm(made, { recursive: true, force: true }));
    dataDir = made;
  }
  const npm = spawn('npm', ['start', '--silent'], {
    cwd: root,
    env: {
      ...process.env,
      PORT: '0',
      DATA_DIR: dataDir,
      DATABASE_URL: '',
      LOG_LEVEL: 'warn',
      SHUTDOWN_GRACE_MS: '2000',
      ...options.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: options.group ?? false,
  });
  const { both: output } = collectOutput(npm);
  let exited: string | undefined;
  npm.once('exit', (code, signal) => {
    exited = signal ?? `code ${code}`;
  });
  const url = await until(
    'the banner',
    () => {
      if (exited) throw new Error(`npm start exited (${exited}) before it listened`);
      return /listening on (\S+)/.exec(output())?.[1];
    },
    60_000,
  ).catch((err: Error) => {
    throw new Error(`${err.message}; it printed:\n${output().slice(-4000)}`);
  });
  // `node gateway/start.mjs`, not a shell that runs it.
  const node = descendants(npm.pid as number).find((p) => argv(p)[1] === 'gateway/start.mjs') as number;
  // The embedded server stops once its service is gone; the data directory is removed after.
  t.teardown(async () => {
    const below = descendants(npm.pid as number);
    for (const pid of [node, npm.pid as number]) if (!gone(pid)) process.kill(pid, 'SIGKILL');
    await until('the processes of npm start to go', () => below.every(gone), 30_000);
  });
  return { npm, node, url, port: Number(new URL(url).port), dataDir, output };
}

/** An account on the service at `url`, signed up through its API: its key. */
export async function signUpAt(url: string, dataDir: string): Promise<string> {
  const post = async (path: string, body: unknown, key?: string) =>
    (
      await fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body: JSON.stringify(body),
      })
    ).json() as Promise<Record<string, string>>;
  const email = uniqueEmail('shutdown');
  await post('/api/auth/register', { email, password: PASSWORD });
  await post('/api/auth/verify', { token: tokenFrom(await waitForMail(join(dataDir, 'mail'), email, /verify/i)) });
  return (await post('/api/auth/token', { email, password: PASSWORD })).key as string;
}
