import { readFileSync } from 'node:fs';

/**
 * True while the process with this pid runs: it exists (EPERM: under another user) and is not
 * a zombie. A zombie has exited and holds nothing (no files, no memory); it only waits for its
 * parent, or for init when its parent died too, to collect its status, which may take a while.
 */
export function processRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    // `pid (comm) S ...`: comm may hold spaces and parentheses, so the state follows the last `)`.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return true; // no /proc (not Linux): the signal's answer stands
  }
}

/**
 * True while the pid exists, a zombie or not, under any user: what a lock file's check asks
 * (PostgreSQL's own takes a pid that exists for a live owner).
 */
export function pidExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Sends `sig` to `pid`; false when there is no such process (it exited meanwhile) or it is not ours. */
export function signalProcess(pid: number, sig: NodeJS.Signals): boolean {
  try {
    process.kill(pid, sig);
    return true;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ESRCH' || code === 'EPERM') return false;
    throw err;
  }
}
