import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Confine } from './isolation.ts';
import { FETCH_TIMEOUT_MS, machineTrust, type OnOutput, runStreamed } from './run-streamed.ts';

/** Where a sandbox's npm packages go; its `node_modules/.bin` is on the sandbox's PATH. */
export function npmPrefix(dir: string): string {
  return join(dir, '.svc', 'npm');
}

/** The directory of the sandbox's npm package binaries (first on every sandbox process's PATH). */
export function npmBin(dir: string): string {
  return join(npmPrefix(dir), 'node_modules', '.bin');
}

/**
 * Installs the environment's npm packages into the sandbox (`npm install --prefix
 * <sandbox>/.svc/npm`), with the sandbox's environment: HOME is the sandbox, so npm reads its
 * configuration from the runner machine's global npmrc and from `npm_config_*` variables of the
 * environment (a private registry and its token go there), and keeps its cache in the sandbox.
 * The machine's TLS trust variables (NODE_EXTRA_CA_CERTS, ...) are kept.
 */
export async function installNpm(
  dir: string,
  packages: string[],
  env: Record<string, string>,
  onOutput: OnOutput,
  confine?: Confine,
): Promise<void> {
  const prefix = npmPrefix(dir);
  await mkdir(prefix, { recursive: true });
  const args = ['install', '--prefix', prefix, '--no-audit', '--no-fund', '--no-save', '--', ...packages];
  try {
    await runStreamed(
      'npm install',
      'npm',
      args,
      { cwd: dir, env: { ...machineTrust(), ...env }, timeoutMs: FETCH_TIMEOUT_MS, confine },
      onOutput,
    );
  } catch (err) {
    throw new Error(`installing npm packages (${packages.join(', ')}) failed: ${(err as Error).message}`);
  }
}

/**
 * Installs apt packages on the runner's machine, which only a runner started with `--allow-apt`
 * does: the packages are the machine's, not the sandbox's, so its owner opts in. It then runs
 * `apt-get update` and `apt-get install -y --no-install-recommends`, as root, or through
 * `sudo -n` (passwordless sudo) when the runner is not root. Without the option the stage fails
 * with a message naming the packages and what to do.
 */
export async function installApt(
  dir: string,
  packages: string[],
  allowApt: boolean,
  env: Record<string, string>,
  onOutput: OnOutput,
): Promise<void> {
  if (!allowApt) {
    throw new Error(
      `this runner may not install apt packages (${packages.join(', ')}): start svc-runner with --allow-apt, as root or with passwordless sudo`,
    );
  }
  const root = process.getuid?.() === 0;
  const aptEnv = { ...env, DEBIAN_FRONTEND: 'noninteractive' };
  const run = (what: string, args: string[]) =>
    root
      ? runStreamed(what, 'apt-get', args, { cwd: dir, env: aptEnv, timeoutMs: FETCH_TIMEOUT_MS }, onOutput)
      : runStreamed(
          what,
          'sudo',
          ['-n', '--preserve-env=DEBIAN_FRONTEND', 'apt-get', ...args],
          { cwd: dir, env: aptEnv, timeoutMs: FETCH_TIMEOUT_MS },
          onOutput,
        );
  try {
    await run('apt-get update', ['update']);
    await run('apt-get install', ['install', '-y', '--no-install-recommends', '--', ...packages]);
  } catch (err) {
    throw new Error(
      `installing apt packages (${packages.join(', ')}) failed: ${(err as Error).message}${root ? '' : ' (the runner is not root: it needs passwordless sudo)'}`,
    );
  }
}
