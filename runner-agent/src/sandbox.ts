import { spawn } from 'node:child_process';
import { chmod, chown, mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { RunnerEvent } from '@svc/core';
import type { RunAs, RunnerEgress, SandboxEgress } from './network.ts';

export interface SandboxSpec {
  id: string;
  incarnation: number;
  conversationId: string;
  env: Record<string, string>;
  setupScript: string | null;
  /** The egress policy (stage `network`): null or absent is unrestricted. */
  network?: { allowed_hosts: string[] } | null;
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
 * The environment a sandbox's processes start with: the sandbox's own, nothing of ours but
 * the egress proxy variables of `conversationId`'s processes, which the sandbox's variables
 * cannot override.
 */
export function sandboxEnv(
  sandbox: { dir: string; env: Record<string, string>; egress?: SandboxEgress },
  conversationId?: string,
): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin',
    HOME: sandbox.dir,
    LANG: 'C.UTF-8',
    ...sandbox.env,
    ...(conversationId && sandbox.egress ? sandbox.egress.env(conversationId) : {}),
  };
}

/** The directory a sandbox lives in under the runner's root. */
export function sandboxDir(root: string, id: string): string {
  return join(root, 'sandboxes', id);
}

/**
 * Builds a sandbox under `root`, reporting each stage as it goes: `provision` (its directory,
 * owned by the `--run-as` user when there is one), `network` (the egress policy, through
 * `egress`; see RunnerEgress.apply) and `setup` (the environment's setup script, its output
 * streamed as stdout/stderr events).
 * The build ends with stage `sandbox` `done` (the service then marks the sandbox ready; the
 * service opened that stage when it asked for the machine) or, after the failed stage,
 * `sandbox` `failed` with the reason, and rejects.
 */
export async function buildSandbox(
  root: string,
  spec: SandboxSpec,
  emit: Emit,
  egress?: RunnerEgress,
): Promise<Sandbox> {
  const started = Date.now();
  const closing = { conversation_id: spec.conversationId, kind: 'stage' as const, stream: 'stage' as const };
  try {
    const sandbox = await buildSteps(root, spec, emit, egress);
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

async function buildSteps(root: string, spec: SandboxSpec, emit: Emit, egress?: RunnerEgress): Promise<Sandbox> {
  const dir = sandboxDir(root, spec.id);
  const user = egress?.runAs ?? undefined;
  await stage(emit, spec.conversationId, 'provision', async () => {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    if (user) {
      // The user may pass through the runner's directories to its sandbox, not list them.
      await chmod(root, 0o711);
      await chmod(join(root, 'sandboxes'), 0o711);
      await chown(dir, user.uid, user.gid);
    }
  });
  const sandbox: Sandbox = {
    id: spec.id,
    incarnation: spec.incarnation,
    dir,
    env: spec.env,
    ...(user ? { user } : {}),
  };
  if (egress) sandbox.egress = await egress.apply(spec, emit);
  const script = spec.setupScript;
  if (script?.trim()) {
    await stage(emit, spec.conversationId, 'setup', () =>
      runScript(script, dir, sandboxEnv(sandbox, spec.conversationId), user, (stream, data) =>
        emit({ conversation_id: spec.conversationId, kind: 'output', stream, data }),
      ),
    );
  }
  return sandbox;
}

/** Runs a shell script in its own process group, streaming its output; rejects on a non-zero exit. */
function runScript(
  script: string,
  cwd: string,
  env: Record<string, string>,
  user: RunAs | undefined,
  onOutput: (stream: 'stdout' | 'stderr', data: string) => void,
): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-c', script], {
      cwd,
      env,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(user ? { uid: user.uid, gid: user.gid } : {}),
    });
    child.stdout.setEncoding('utf8').on('data', (d: string) => onOutput('stdout', d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => onOutput('stderr', d));
    child.on('error', reject);
    child.on('close', (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`the setup script ${signal ? `was killed by ${signal}` : `exited with ${code}`}`));
    });
  });
}
