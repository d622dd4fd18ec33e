import type { ChildProcess } from 'node:child_process';

/**
 * What a child process prints, collected as it arrives: stdout, stderr, and both in the order
 * they came; and its exit code once it exits. Attach it right after spawning.
 */
export function collectOutput(child: ChildProcess) {
  let out = '';
  let err = '';
  let both = '';
  child.stdout?.on('data', (d: Buffer) => {
    out += d;
    both += d;
  });
  child.stderr?.on('data', (d: Buffer) => {
    err += d;
    both += d;
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { out: () => out, err: () => err, both: () => both, exited };
}
