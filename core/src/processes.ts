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
