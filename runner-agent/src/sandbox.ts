import { readdirSync } from 'node:fs';
import { chmod, chown, lchown, mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { dirname, join, relative, sep } from 'node:path';
import type { BrokerBinding, RunnerEvent } from '@svc/core';
import { SYSTEM_TRUST_BUNDLES } from './broker.ts';
import { gitClone, pathInside } from './clone.ts';
import type { Confine, Isolation } from './isolation.ts';
import type { RunnerEgress, SandboxEgress } from './network.ts';
import { installApt, installNpm, npmBin, npmPrefix } from './packages.ts';
import type { RunAs } from './run-as.ts';
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
  /** The hosts its runtimes always reach (the model provider's, the service's). */
  reach?: string[] | undefined;
  /** Present when its egress is brokered (stage `broker`): the build's bound secrets. */
  broker?: BrokerBinding[] | undefined;
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
  /** How the sandbox's processes are isolated (absent: not at all). */
  isolation?: Isolation | undefined;
}

/** A sandbox on this machine: its directory and the environment its processes get. */
export interface Sandbox {
  id: string;
  incarnation: number;
  dir: string;
  env: Record<string, string>;
  /** The proxy variables its processes get (stage `network`). */
  egress?: SandboxEgress;
  /** The user its processes run as (`--run-as`, or the isolation's); absent: the runner's own. */
  user?: RunAs;
  /** How its processes are started in its namespaces; absent: they are not isolated. */
  confine?: Confine;
  /**
   * A brokered sandbox's trust: its CA's certificate and the machine's bundle with it, which its
   * processes are pointed at (and which an isolated sandbox sees as the system bundle).
   */
  trust?: { ca: string; bundle: string };
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
  sandbox: {
    dir: string;
    env: Record<string, string>;
    egress?: SandboxEgress;
    trust?: { ca: string; bundle: string } | undefined;
  },
  conversationId?: string,
  bindings?: readonly BrokerBinding[],
): Record<string, string> {
  const { trust } = sandbox;
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin',
    HOME: sandbox.dir,
    LANG: 'C.UTF-8',
    ...sandbox.env,
    ...(conversationId && sandbox.egress ? sandbox.egress.env(conversationId, bindings) : {}),
    // The broker's CA, for the clients that do not read the system bundle (bound over with
    // it by the confinement). Of the runtimes, Claude Code and Gemini CLI (Node) trust it
    // through NODE_EXTRA_CA_CERTS alone, Codex through SSL_CERT_FILE or the bundle, opencode
    // (Bun) through either variable or the bundle (test/src/broker-runtimes.test.ts).
    ...(trust
      ? {
          NODE_EXTRA_CA_CERTS: trust.ca,
          SSL_CERT_FILE: trust.bundle,
          REQUESTS_CA_BUNDLE: trust.bundle,
          CURL_CA_BUNDLE: trust.bundle,
          GIT_SSL_CAINFO: trust.bundle,
        }
      : {}),
  };
  env.PATH = `${npmBin(sandbox.dir)}:${env.PATH}`;
  return env;
}

/** The directory a sandbox lives in under the runner's root. */
export function sandboxDir(root: string, id: string): string {
  return join(root, 'sandboxes', id);
}

/** The ids of the sandbox directories under the runner's root (none when it has none yet). */
export function sandboxesOnDisk(root: string): string[] {
  try {
    return readdirSync(join(root, 'sandboxes'), { withFileTypes: true })
      .filter((d) => d.isDirectory() && /^[A-Za-z0-9_-]{1,64}$/.test(d.name))
      .map((d) => d.name);
  } catch {
    return [];
  }
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
  const user = sandboxUser(options);
  const skills = spec.skills ?? [];
  await stage(emit, spec.conversationId, 'provision', async () => {
    // A machine that cannot isolate builds nothing (DECISIONS: it refuses, naming the setting).
    options.isolation?.assertAvailable();
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await writeInlineSkills(dir, skills);
    if (user) {
      // The user may pass through the runner's directories to its sandbox, not list them.
      await chmod(root, 0o711);
      await chmod(join(root, 'sandboxes'), 0o711);
      if (options.isolation?.mode === 'namespaces') await openAncestors(root);
      await chownTree(dir, user);
    }
  });
  const sandbox = await sandboxOn(dir, spec, emit, options);
  const env = sandboxEnv(sandbox, spec.conversationId, spec.broker);
  const { confine } = sandbox;
  const output = (stream: 'stdout' | 'stderr', data: string) =>
    emit({ conversation_id: spec.conversationId, kind: 'output', stream, data });
  const repositories = spec.repositories ?? [];
  const sources = skills.filter((s) => 'source' in s);
  // A directory the runner makes for a confined process to write into becomes the sandbox user's.
  const own = async (path: string) => {
    if (!user) return;
    for (let p = path; p !== dir && !relative(dir, p).startsWith('..'); p = dirname(p))
      await lchown(p, user.uid, user.gid);
  };
  if (repositories.length > 0 || sources.length > 0) {
    await stage(emit, spec.conversationId, 'clone', async () => {
      for (const repo of repositories) {
        const target = await pathInside(dir, repo.mount_path);
        await own(dirname(target));
        await gitClone(repo.url, target, undefined, { cwd: dir, env, confine }, output);
      }
      if (sources.length > 0) {
        await mkdir(join(dir, '.svc', 'skill-sources'), { recursive: true });
        await own(join(dir, '.svc', 'skill-sources'));
      }
      for (const source of sources) await installSkillSource(dir, source, env, output, confine);
    });
  }
  const npm = spec.packages?.npm ?? [];
  const apt = spec.packages?.apt ?? [];
  if (npm.length > 0 || apt.length > 0) {
    await stage(emit, spec.conversationId, 'packages', async () => {
      // apt first: a refused or failed apt install fails the build before a long npm install.
      if (apt.length > 0) await installApt(dir, apt, options.allowApt, env, output);
      if (npm.length > 0) {
        await mkdir(npmPrefix(dir), { recursive: true });
        await own(npmPrefix(dir));
        await installNpm(dir, npm, env, output, confine);
      }
    });
  }
  // What the runner wrote itself (skills copied out of their source, and without isolation
  // the clones and packages) becomes the sandbox user's.
  if (user && (repositories.length > 0 || sources.length > 0 || npm.length > 0)) await chownTree(dir, user);
  const script = spec.setupScript;
  if (script?.trim()) {
    await stage(emit, spec.conversationId, 'setup', () =>
      runStreamed(
        'the setup script',
        'bash',
        ['-c', script],
        { cwd: dir, env, confine, ...(user ? { user } : {}) },
        output,
      ),
    );
  }
  return sandbox;
}

/** The user a sandbox's processes run as: the isolation's (`--run-as`, or nobody for a root runner), else `--run-as`. */
function sandboxUser(options: BuildOptions): RunAs | undefined {
  return options.isolation?.user ?? options.egress?.runAs ?? undefined;
}

/**
 * Lets every user pass through (not list) the directories above the runner's root, which the
 * sandbox user needs to reach its directory: bubblewrap looks a bound directory up as that
 * user. Only directories of the runner's own user are changed (the `local` provider's DATA_DIR);
 * mode bits other than other's search stay as they are.
 */
async function openAncestors(root: string): Promise<void> {
  const uid = process.getuid?.();
  for (let p = dirname(root); p !== sep && p !== '.'; p = dirname(p)) {
    const found = await stat(p).catch(() => undefined);
    if (found && found.uid === uid && (found.mode & 0o001) === 0) await chmod(p, (found.mode & 0o7777) | 0o001);
  }
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
  const user = sandboxUser(options);
  const sandbox: Sandbox = {
    id: spec.id,
    incarnation: spec.incarnation,
    dir,
    env: spec.env,
    ...(user ? { user } : {}),
  };
  if (options.egress) sandbox.egress = await options.egress.apply(spec, emit, options.isolation);
  if (options.egress && spec.broker !== undefined) {
    const broker = await options.egress.prepareBroker(spec, emit);
    sandbox.trust = await writeTrust(dir, broker.ca.certPem, user);
  }
  const confine = options.isolation?.confinement(dir, sandbox.egress?.bridges, sandbox.trust?.bundle);
  if (confine) sandbox.confine = confine;
  return sandbox;
}

/**
 * Writes a brokered sandbox's trust into `<dir>/.svc/broker`: its CA's certificate, and the
 * machine's bundle (the first of SYSTEM_TRUST_BUNDLES there is) with it. Readable by the
 * sandbox's processes; `.svc` and the directory are the sandbox user's, as the rest of `.svc`.
 */
async function writeTrust(
  dir: string,
  caPem: string,
  user: RunAs | undefined,
): Promise<{ ca: string; bundle: string }> {
  const at = join(dir, '.svc', 'broker');
  await mkdir(at, { recursive: true });
  let system = '';
  for (const path of SYSTEM_TRUST_BUNDLES) {
    system = await readFile(path, 'utf8').catch(() => '');
    if (system) break;
  }
  const ca = join(at, 'ca.pem');
  const bundle = join(at, 'ca-bundle.pem');
  await writeFile(ca, caPem, { mode: 0o644 });
  await writeFile(bundle, `${system.trimEnd()}\n${caPem}`, { mode: 0o644 });
  if (user) {
    for (const p of [join(dir, '.svc'), at, ca, bundle]) await lchown(p, user.uid, user.gid);
  }
  return { ca, bundle };
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
