import { chmod, chown, lchown, mkdir, readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { RunnerEvent } from '@svc/core';
import { gitClone, pathInside } from './clone.ts';
import type { RunAs, RunnerEgress, SandboxEgress } from './network.ts';
import { installApt, installNpm, npmBin } from './packages.ts';
import { runStreamed } from './run-streamed.ts';
import { installSkillSource, type SkillSpec, writeInlineSkills } from './skills.ts';

export interface SandboxSpec {
  id: string;
  incarnation: number;
  conversationId: string;
  env: Record<string, string>;
  setupScript: string | null;
  /** The egress policy (stage `network`): null or absent is unrestricted. */
  network?: { allowed_hosts: string[] } | null;
  repositories?: { url: string; mount_path: string }[] | undefined;
  packages?: { apt?: string[] | undefined; npm?: string[] | undefined } | undefined;
  skills?: SkillSpec[] | undefined;
  /** Adopt the directory an earlier process of this runner left (a suspended sandbox woken): no build. */
  adopt?: boolean | undefined;
}

/** What the runner's owner allows builds to do on this machine, and its egress. */
export interface BuildOptions {
  /** `--allow-apt`: apt packages may be installed on the machine (as root or with sudo -n). */
  allowApt: boolean;
  /** The runner's egress proxy and `--run-as` user (stage `network`). */
  egress?: RunnerEgress | undefined;
}

/** A sandbox on this machine: its directory and the environment its processes get. */
export interface Sandbox {
  id: string;
  incarnation: number;
  dir: string;
  env: Record<string, string>;
  /** The proxy variables its processes get (stage `network`). */
  egress?: SandboxEgress;
  /** The user its processes run as (`--run-as`); absent: the runner's own. */
  user?: RunAs;
}

type Emit = (event: RunnerEvent) => void;

/** Runs `fn` as stage `name`: started, then done or failed with its duration. */
async function stage<T>(emit: Emit, conversationId: string, name: string, fn: () => Promise<T>): Promise<T> {
  const base = { conversation_id: conversationId, kind: 'stage' as const, stream: 'stage' as const, stage: name };
  emit({ ...base, state: 'started' });
  const started = Date.now();
  try {
    const result = await fn();
    emit({ ...base, state: 'done', duration_ms: Date.now() - started });
    return result;
  } catch (err) {
    emit({ ...base, state: 'failed', duration_ms: Date.now() - started, data: (err as Error).message });
    throw err;
  }
}

/**
 * The environment a sandbox's processes start with: the sandbox's own, with the binaries of
 * its npm packages first on PATH, and nothing of ours but the egress proxy variables of
 * `conversationId`'s processes, which the sandbox's variables cannot override.
 */
export function sandboxEnv(
  sandbox: { dir: string; env: Record<string, string>; egress?: SandboxEgress },
  conversationId?: string,
): Record<string, string> {
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin',
    HOME: sandbox.dir,
    LANG: 'C.UTF-8',
    ...sandbox.env,
    ...(conversationId && sandbox.egress ? sandbox.egress.env(conversationId) : {}),
  };
  env.PATH = `${npmBin(sandbox.dir)}:${env.PATH}`;
  return env;
}

/** The directory a sandbox lives in under the runner's root. */
export function sandboxDir(root: string, id: string): string {
  return join(root, 'sandboxes', id);
}

/**
 * Builds a sandbox under `root`, reporting each stage as it goes: `provision` (its directory,
 * owned by the `--run-as` user when there is one, and the agent's inline skills written into
 * it), `network` (the egress policy, through the runner's egress; see RunnerEgress.apply),
 * `clone` (the environment's repositories into their `mount_path`, then skills from a source),
 * `packages` (apt, then npm) and `setup` (the environment's setup script). Each stage's output
 * (git, npm, apt-get, the script) is streamed as stdout/stderr events. A stage with nothing to
 * do is not reported at all. git and npm fetch through the sandbox's egress proxy, so an
 * allowlist must name the hosts they fetch from.
 * The build ends with stage `sandbox` `done` (the service then marks the sandbox ready; the
 * service opened that stage when it asked for the machine) or, after the failed stage,
 * `sandbox` `failed` with the reason, and rejects.
 */
export async function buildSandbox(
  root: string,
  spec: SandboxSpec,
  emit: Emit,
  options: BuildOptions = { allowApt: false },
): Promise<Sandbox> {
  if (spec.adopt) return adoptSandbox(root, spec, emit, options);
  const started = Date.now();
  const closing = { conversation_id: spec.conversationId, kind: 'stage' as const, stream: 'stage' as const };
  try {
    const sandbox = await buildSteps(root, spec, emit, options);
    emit({ ...closing, stage: 'sandbox', state: 'done', duration_ms: Date.now() - started });
    return sandbox;
  } catch (err) {
    emit({
      ...closing,
      stage: 'sandbox',
      state: 'failed',
      duration_ms: Date.now() - started,
      data: (err as Error).message,
    });
    throw err;
  }
}

async function buildSteps(root: string, spec: SandboxSpec, emit: Emit, options: BuildOptions): Promise<Sandbox> {
  const dir = sandboxDir(root, spec.id);
  const { egress } = options;
  const user = egress?.runAs ?? undefined;
  const skills = spec.skills ?? [];
  await stage(emit, spec.conversationId, 'provision', async () => {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await writeInlineSkills(dir, skills);
    if (user) {
      // The user may pass through the runner's directories to its sandbox, not list them.
      await chmod(root, 0o711);
      await chmod(join(root, 'sandboxes'), 0o711);
      await chownTree(dir, user);
    }
  });
  const sandbox = await sandboxOn(dir, spec, emit, options);
  const env = sandboxEnv(sandbox, spec.conversationId);
  const output = (stream: 'stdout' | 'stderr', data: string) =>
    emit({ conversation_id: spec.conversationId, kind: 'output', stream, data });
  const repositories = spec.repositories ?? [];
  const sources = skills.filter((s) => 'source' in s);
  if (repositories.length > 0 || sources.length > 0) {
    await stage(emit, spec.conversationId, 'clone', async () => {
      for (const repo of repositories) {
        await gitClone(repo.url, await pathInside(dir, repo.mount_path), undefined, { cwd: dir, env }, output);
      }
      for (const source of sources) await installSkillSource(dir, source, env, output);
    });
  }
  const npm = spec.packages?.npm ?? [];
  const apt = spec.packages?.apt ?? [];
  if (npm.length > 0 || apt.length > 0) {
    await stage(emit, spec.conversationId, 'packages', async () => {
      // apt first: a refused or failed apt install fails the build before a long npm install.
      if (apt.length > 0) await installApt(dir, apt, options.allowApt, env, output);
      if (npm.length > 0) await installNpm(dir, npm, env, output);
    });
  }
  // The runner cloned and installed as itself: what it wrote becomes the sandbox user's.
  if (user && (repositories.length > 0 || sources.length > 0 || npm.length > 0)) await chownTree(dir, user);
  const script = spec.setupScript;
  if (script?.trim()) {
    await stage(emit, spec.conversationId, 'setup', () =>
      runStreamed('the setup script', 'bash', ['-c', script], { cwd: dir, env, ...(user ? { user } : {}) }, output),
    );
  }
  return sandbox;
}

/**
 * Wakes a suspended sandbox: the directory an earlier runner-agent process built (and kept when
 * it stopped) is taken as it is, with its repositories, packages and files; nothing is built
 * again. The egress policy is applied again (stage `network`, when there is one), and the
 * runtimes start afresh: the processes of the earlier runner-agent went with it. Ends with
 * stage `reattach` done (the service then marks the sandbox ready) or failed, when the
 * directory is gone, and rejects then.
 */
async function adoptSandbox(root: string, spec: SandboxSpec, emit: Emit, options: BuildOptions): Promise<Sandbox> {
  const started = Date.now();
  const closing = {
    conversation_id: spec.conversationId,
    kind: 'stage' as const,
    stream: 'stage' as const,
    stage: 'reattach',
  };
  const dir = sandboxDir(root, spec.id);
  try {
    const found = await stat(dir).catch(() => undefined);
    if (!found?.isDirectory())
      throw new Error(`the sandbox directory is gone (removed while it was suspended); it cannot be woken`);
    const sandbox = await sandboxOn(dir, spec, emit, options);
    emit({
      ...closing,
      state: 'done',
      duration_ms: Date.now() - started,
      data: JSON.stringify({ woken: true, disk: 'kept', runtime_session: 'fresh' }),
    });
    return sandbox;
  } catch (err) {
    emit({ ...closing, state: 'failed', duration_ms: Date.now() - started, data: (err as Error).message });
    throw err;
  }
}

/**
 * The sandbox as this runner holds it, in `dir`, run as the egress user when there is one,
 * with its egress policy applied (stage `network`, when there is one): after a build, or when
 * a kept directory is woken.
 */
async function sandboxOn(dir: string, spec: SandboxSpec, emit: Emit, options: BuildOptions): Promise<Sandbox> {
  const user = options.egress?.runAs ?? undefined;
  const sandbox: Sandbox = {
    id: spec.id,
    incarnation: spec.incarnation,
    dir,
    env: spec.env,
    ...(user ? { user } : {}),
  };
  if (options.egress) sandbox.egress = await options.egress.apply(spec, emit);
  return sandbox;
}

/** Gives a directory tree to `user` (symbolic links themselves, never what they point to). */
async function chownTree(dir: string, user: RunAs): Promise<void> {
  await chown(dir, user.uid, user.gid);
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) await chownTree(path, user);
    else await lchown(path, user.uid, user.gid);
  }
}
