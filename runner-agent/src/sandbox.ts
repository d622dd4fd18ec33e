import { spawn } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { RunnerEvent } from '@svc/core';

export interface SandboxSpec {
  id: string;
  incarnation: number;
  conversationId: string;
  env: Record<string, string>;
  setupScript: string | null;
}

/** A sandbox on this machine: its directory and the environment its processes get. */
export interface Sandbox {
  id: string;
  incarnation: number;
  dir: string;
  env: Record<string, string>;
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

/** The environment a sandbox's processes start with: the sandbox's own, nothing of ours. */
export function sandboxEnv(sandbox: { dir: string; env: Record<string, string> }): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin',
    HOME: sandbox.dir,
    LANG: 'C.UTF-8',
    ...sandbox.env,
  };
}

/** The directory a sandbox lives in under the runner's root. */
export function sandboxDir(root: string, id: string): string {
  return join(root, 'sandboxes', id);
}

/**
 * Builds a sandbox under `root`, reporting each stage as it goes: `provision` (its directory)
 * and `setup` (the environment's setup script, its output streamed as stdout/stderr events).
 * The build ends with stage `sandbox` `done` (the service then marks the sandbox ready; the
 * service opened that stage when it asked for the machine) or, after the failed stage,
 * `sandbox` `failed` with the reason, and rejects.
 */
export async function buildSandbox(root: string, spec: SandboxSpec, emit: Emit): Promise<Sandbox> {
  const started = Date.now();
  const closing = { conversation_id: spec.conversationId, kind: 'stage' as const, stream: 'stage' as const };
  try {
    const sandbox = await buildSteps(root, spec, emit);
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

async function buildSteps(root: string, spec: SandboxSpec, emit: Emit): Promise<Sandbox> {
  const dir = sandboxDir(root, spec.id);
  await stage(emit, spec.conversationId, 'provision', () => mkdir(dir, { recursive: true, mode: 0o700 }));
  const sandbox: Sandbox = { id: spec.id, incarnation: spec.incarnation, dir, env: spec.env };
  const script = spec.setupScript;
  if (script?.trim()) {
    await stage(emit, spec.conversationId, 'setup', () =>
      runScript(script, dir, sandboxEnv(sandbox), (stream, data) =>
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
  onOutput: (stream: 'stdout' | 'stderr', data: string) => void,
): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', ['-c', script], { cwd, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.setEncoding('utf8').on('data', (d: string) => onOutput('stdout', d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => onOutput('stderr', d));
    child.on('error', reject);
    child.on('close', (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`the setup script ${signal ? `was killed by ${signal}` : `exited with ${code}`}`));
    });
  });
}
