import type { ChildProcessByStdio } from 'node:child_process';
import type { Readable } from 'node:stream';
import { type Confine, type Confined, spawnConfined } from './isolation.ts';

/** How long one git clone, npm install or apt-get run may take before the build fails. */
export const FETCH_TIMEOUT_MS = 10 * 60_000;

export type OnOutput = (stream: 'stdout' | 'stderr', data: string) => void;

/**
 * Runs `command` with exactly `env` in its own process group, streaming its output as it comes.
 * Resolves on exit 0; otherwise rejects with an Error whose message is `what` and how the
 * process ended (`exited with 128`, `was killed by SIGTERM`, `could not start: ENOENT`). With
 * `timeoutMs`, the whole group is killed when it runs longer and the Error says `timed out`.
 */
export function runStreamed(
  what: string,
  command: string,
  args: string[],
  options: {
    cwd: string;
    env: Record<string, string>;
    timeoutMs?: number;
    user?: { uid: number; gid: number };
    /** The sandbox's confinement: the command runs in its namespaces (see Isolation). */
    confine?: Confine | undefined;
  },
  onOutput: OnOutput,
): Promise<void> {
  return new Promise((resolve, reject) => {
    let timedOut = false;
    let run: Confined = { command, args, cwd: options.cwd, ...options.user };
    try {
      if (options.confine) run = options.confine(command, args, options.cwd, options.env);
    } catch (err) {
      reject(new Error(`${what} could not start: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`));
      return;
    }
    const child = spawnConfined(run, {
      env: options.env,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    }) as ChildProcessByStdio<null, Readable, Readable>;
    child.stdout.setEncoding('utf8').on('data', (d: string) => onOutput('stdout', d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => onOutput('stderr', d));
    child.on('error', (err: NodeJS.ErrnoException) =>
      reject(new Error(`${what} could not start: ${err.code ?? err.message}`)),
    );
    const timer = options.timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          try {
            process.kill(-(child.pid as number), 'SIGKILL');
          } catch {
            // ESRCH: the group is already gone.
          }
        }, options.timeoutMs)
      : undefined;
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      if (timedOut) reject(new Error(`${what} timed out after ${(options.timeoutMs ?? 0) / 1000} s`));
      else if (code === 0) resolve();
      else reject(new Error(`${what} ${signal ? `was killed by ${signal}` : `exited with ${code}`}`));
    });
  });
}

/** The runner machine's TLS trust settings, which tools fetching for a build (npm, git) keep. */
const TRUST_VARIABLES = ['NODE_EXTRA_CA_CERTS', 'SSL_CERT_FILE', 'SSL_CERT_DIR', 'GIT_SSL_CAINFO'];

/**
 * The runner's own TLS trust variables (a machine behind an inspecting proxy sets them), put
 * under the sandbox's environment so npm and git trust what the machine trusts.
 */
export function machineTrust(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const k of TRUST_VARIABLES) {
    const v = process.env[k];
    if (v) out[k] = v;
  }
  return out;
}
