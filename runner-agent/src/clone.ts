import { mkdir, realpath, stat } from 'node:fs/promises';
import { dirname, isAbsolute, relative, resolve } from 'node:path';
import type { Confine } from './isolation.ts';
import { FETCH_TIMEOUT_MS, machineTrust, type OnOutput, runStreamed } from './run-streamed.ts';

/** How many of git's last stderr lines a failed clone quotes in its message. */
const QUOTED_LINES = 3;

/**
 * The absolute directory `mountPath` names inside the sandbox directory `dir`, created up to
 * its parent. Throws when it is the sandbox itself, lies outside it, or would reach outside
 * through a symbolic link already there (a repository cloned before may hold one).
 */
export async function pathInside(dir: string, mountPath: string): Promise<string> {
  const target = resolve(dir, mountPath);
  const rel = relative(dir, target);
  if (rel === '' || rel.startsWith('..') || isAbsolute(rel)) {
    throw new Error(`mount_path ${JSON.stringify(mountPath)} does not name a directory inside the sandbox`);
  }
  const root = await realpath(dir);
  // The deepest part of the path that exists already must resolve inside the sandbox.
  let existing = dirname(target);
  while (!(await exists(existing))) existing = dirname(existing);
  const real = await realpath(existing);
  if (real !== root && relative(root, real).startsWith('..')) {
    throw new Error(`mount_path ${JSON.stringify(mountPath)} leads outside the sandbox through a symbolic link`);
  }
  if (await exists(target)) throw new Error(`mount_path ${JSON.stringify(mountPath)} already exists in the sandbox`);
  await mkdir(dirname(target), { recursive: true });
  return target;
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * The environment git runs with: the sandbox's, never prompting (a clone that needs a password
 * it does not have fails at once instead of hanging), and with `GIT_TOKEN` from the sandbox's
 * environment, when there is one, sent as HTTP basic auth (user `x-access-token`, which GitHub
 * and GitLab accept for tokens) to the host of an https URL only. The token goes through git's
 * environment configuration, so it is neither on a command line nor left in `.git/config`.
 * The runner machine's TLS trust variables are kept.
 */
export function gitEnv(url: string, env: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {
    ...machineTrust(),
    ...env,
    GIT_TERMINAL_PROMPT: '0',
    GIT_SSH_COMMAND: env.GIT_SSH_COMMAND ?? 'ssh -o BatchMode=yes',
  };
  const token = env.GIT_TOKEN;
  if (token && /^https?:\/\//.test(url)) {
    const origin = new URL(url).origin;
    out.GIT_CONFIG_COUNT = '1';
    out.GIT_CONFIG_KEY_0 = `http.${origin}/.extraHeader`;
    out.GIT_CONFIG_VALUE_0 = `Authorization: Basic ${Buffer.from(`x-access-token:${token}`).toString('base64')}`;
  }
  return out;
}

/**
 * Clones `url` into `target` (which must not exist): shallow (`--depth 1`), at `ref` when given
 * (a branch or tag), git's progress and errors streamed to `onOutput`. A failure rejects with a
 * message naming the URL and quoting git's last lines, e.g. `fatal: repository ... not found`.
 */
export async function gitClone(
  url: string,
  target: string,
  ref: string | undefined,
  options: { cwd: string; env: Record<string, string>; confine?: Confine | undefined },
  onOutput: OnOutput,
): Promise<void> {
  const tail: string[] = [];
  const args = ['clone', '--depth', '1', '--progress', ...(ref ? ['--branch', ref] : []), '--', url, target];
  try {
    await runStreamed(
      'git clone',
      'git',
      args,
      { cwd: options.cwd, env: gitEnv(url, options.env), timeoutMs: FETCH_TIMEOUT_MS, confine: options.confine },
      (stream, data) => {
        if (stream === 'stderr') {
          for (const line of data.split(/[\r\n]+/)) if (line.trim()) tail.push(line.trim());
          tail.splice(0, Math.max(0, tail.length - QUOTED_LINES));
        }
        onOutput(stream, data);
      },
    );
  } catch (err) {
    const said = tail.filter(
      (l) => !/^(Cloning into|remote: (Counting|Compressing|Total)|Receiving|Resolving)/.test(l),
    );
    throw new Error(`cloning ${url} failed: ${(err as Error).message}${said.length ? `: ${said.join(' / ')}` : ''}`);
  }
}
