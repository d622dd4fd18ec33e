import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/** Resident memory of a process in bytes, from /proc (Linux). */
export function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /VmRSS:\s+(\d+) kB/.exec(status);
  return m ? Number(m[1]) * 1024 : Number.NaN;
}

/** CPU seconds a process has used so far, from /proc (Linux): user + system. */
export function cpuSecondsOf(pid: number): number {
  return cpuTimesOf(pid).total;
}

/**
 * CPU seconds a process has used so far, from one read of /proc (Linux): `total` (user +
 * system) and `kernel`, the system time alone (the kernel's time on the process's behalf: its
 * system calls).
 */
export function cpuTimesOf(pid: number): CpuTimes {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // Fields after the command name (which may hold spaces) start at index 2 of what follows ')':
  // utime, then stime.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const user = Number(fields[11]);
  const system = Number(fields[12]);
  return { total: (user + system) / clockTicks(), kernel: system / clockTicks() };
}

export interface CpuTimes {
  total: number;
  kernel: number;
}

let ticksPerSecond: number | undefined;
function clockTicks(): number {
  if (ticksPerSecond === undefined) {
    try {
      ticksPerSecond = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;
    } catch {
      ticksPerSecond = 100;
    }
  }
  return ticksPerSecond;
}

/** Sum over a process and its descendants (an nginx master and its workers, say). */
export function treeOf(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    try {
      const children = readFileSync(`/proc/${out[i]}/task/${out[i]}/children`, 'utf8').trim();
      if (children) out.push(...children.split(' ').map(Number));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** Proportional set size of the tree (shared pages divided among their users), in bytes. */
export function pssOfTree(pid: number): number {
  let total = 0;
  for (const p of treeOf(pid)) {
    try {
      const m = /^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${p}/smaps_rollup`, 'utf8'));
      total += Number(m?.[1] ?? 0) * 1024;
    } catch {} // exited meanwhile
  }
  return total;
}

export const rssOfTree = (pid: number) => treeOf(pid).reduce((a, p) => a + safe(() => rssOf(p)), 0);
export const cpuOfTree = (pid: number) => cpuTimesOfTree(pid).total;
/** `cpuTimesOf` summed over a process and its descendants. */
export function cpuTimesOfTree(pid: number): CpuTimes {
  const sum = { total: 0, kernel: 0 };
  for (const p of treeOf(pid)) {
    try {
      const times = cpuTimesOf(p);
      sum.total += times.total;
      sum.kernel += times.kernel;
    } catch {
      // gone meanwhile
    }
  }
  return sum;
}
const safe = (fn: () => number) => {
  try {
    return fn();
  } catch {
    return 0;
  }
};

export async function freePort(host = '127.0.0.1'): Promise<number> {
  return await new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, host, () => {
      const addr = s.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      s.close(() => resolve(port));
    });
  });
}

export interface Started {
  child: ChildProcess;
  /** The capture groups of the ready line. */
  ready: RegExpExecArray;
  stop(): Promise<void>;
}

/**
 * Starts a process and waits for a line of its output matching `ready`. Output is kept (the
 * last 8 KiB) and shown if it exits first or the wait times out.
 */
export async function startProcess(
  command: string,
  args: string[],
  opts: { ready: RegExp; env?: NodeJS.ProcessEnv; cwd?: string; timeoutMs?: number; name?: string },
): Promise<Started> {
  const child = spawn(command, args, {
    cwd: opts.cwd,
    env: opts.env ?? process.env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const name = opts.name ?? command;
  let out = '';
  const ready = await new Promise<RegExpExecArray>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${name} was not ready within ${opts.timeoutMs ?? 60_000} ms:\n${out}`));
    }, opts.timeoutMs ?? 60_000);
    const onData = (d: Buffer) => {
      out = (out + d.toString()).slice(-8192);
      const m = opts.ready.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    };
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? signal}) before it was ready:\n${out}`));
    });
  });
  // Keep draining so a chatty child never blocks on a full pipe.
  child.stdout?.resume();
  child.stderr?.resume();
  return {
    child,
    ready,
    stop: () => stopChild(child),
  };
}

export async function stopChild(child: ChildProcess, graceMs = 5000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(timer);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Waits until `fn` returns true, polling; false when `timeoutMs` passes first. */
export async function until(fn: () => boolean | Promise<boolean>, timeoutMs: number, everyMs = 50): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await fn()) return true;
    await sleep(everyMs);
  }
  return false;
}
