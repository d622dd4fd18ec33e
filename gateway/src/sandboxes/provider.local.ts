import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { delimiter, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ApiError, newId, processRunning } from '@svc/core';
import { runners, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import { RUNNER_TOKEN_PREFIX } from '../fabric/presence.ts';
import { hashSecret, newSecret } from '../secrets/tokens.ts';
import type { MachineHealth, SandboxProvider, SandboxRef } from './provider.ts';

const RUNNER_BIN = fileURLToPath(new URL('../../../runner-agent/bin/svc-runner.mjs', import.meta.url));
/**
 * Where the agent CLIs the service ships (gateway/package.json) are installed: the bin
 * directories of its own install, the gateway workspace's and the root's node_modules.
 */
const SHIPPED_BINS = [
  fileURLToPath(new URL('../../node_modules/.bin', import.meta.url)),
  fileURLToPath(new URL('../../../node_modules/.bin', import.meta.url)),
];
/** How long a started runner-agent has to connect back. */
const CONNECT_TIMEOUT_MS = 30_000;
/** How long a runner-agent told to stop has to stop its runtimes and exit before it is killed. */
const STOP_TIMEOUT_MS = 10_000;

/**
 * The `local` sandbox provider, the instance's default for development: each sandbox gets a
 * runner-agent child process of its own, started with a one-sandbox runner token and
 * connected back over the same fabric as any runner, its sandboxes under DATA_DIR. The child
 * and its runner go with the sandbox, and all of them when the service stops.
 */
export class LocalSandboxes implements SandboxProvider {
  readonly name = 'local';
  readonly suspends = true;
  // Its runner-agent is the machine: it stops with the suspension, and the wake starts another.
  readonly suspendKeepsRunner = false;
  readonly showsRunner = false;
  // The runner-agent is a child of the service, so a restart of the service took it along.
  readonly adrift = {
    state: 'interrupted',
    error: 'the service restarted and the sandbox’s runner-agent went with it',
    reason: 'service_restarted',
  } as const;
  readonly startTimeoutMs = CONNECT_TIMEOUT_MS;
  private readonly children = new Map<string, { child: ChildProcess; runnerId: string }>();
  /** Set by stopAll: the service is closing, and no start waits for its runner-agent any more. */
  private closing = false;

  constructor(
    private readonly deps: {
      sql: Sql;
      fabric: RunnerFabric;
      logger: Logger;
      /** The service's own base URL (the child connects back to it). */
      baseUrl: () => string;
      root: string;
      /** SANDBOX_ISOLATION, passed to each runner-agent as `--isolation`. */
      isolation?: 'namespaces' | 'none';
      /** Paths its sandboxes must not see (`--hide`): the instance's DATA_DIR. */
      hidden?: string[];
    },
  ) {}

  /** Local machines are made by `create`, never placed on a runner. */
  async place(): Promise<null> {
    return null;
  }

  /** Live while its runner-agent is connected; a runner-agent that is gone does not come back. */
  async health(sandbox: SandboxRef): Promise<MachineHealth> {
    return sandbox.runner_id !== null && this.deps.fabric.isLive(sandbox.runner_id) ? 'live' : 'lost';
  }

  /** Its runner-agent when it is connected, else a new one started for it. */
  async create(sandbox: SandboxRef): Promise<string> {
    if (sandbox.runner_id !== null && this.deps.fabric.isLive(sandbox.runner_id)) return sandbox.runner_id;
    return this.start(sandbox.account_id, sandbox.id);
  }

  /** As `create`: a turn on a sandbox whose runner-agent died meanwhile gets a new one. */
  async adopt(sandbox: SandboxRef): Promise<string> {
    return this.create(sandbox);
  }

  /** Always a runner-agent of its own (one still stopping after the suspension is replaced). */
  async wake(sandbox: SandboxRef): Promise<string> {
    return this.start(sandbox.account_id, sandbox.id);
  }

  async suspend(sandbox: { id: string }, runnerId: string): Promise<void> {
    await this.stop(sandbox.id, { runnerId, graceful: true });
  }

  /** Its runner-agent stops and its directory goes, also when it was suspended (no runner-agent to tell). */
  async destroy(sandbox: SandboxRef): Promise<void> {
    // Graceful: the directory is removed once nothing writes into it any more.
    await this.stop(sandbox.id, { graceful: true });
    await this.removeDisk(sandbox.account_id, sandbox.id);
  }

  /** Starts the sandbox's runner-agent and resolves with its runner id once it is connected. */
  async start(accountId: string, sandboxId: string): Promise<string> {
    // One runner-agent per sandbox: one still running for it (stopping after a suspension) goes first.
    await this.stop(sandboxId, { graceful: true });
    const token = newSecret(RUNNER_TOKEN_PREFIX);
    const runner = await runners.insertRunner(this.deps.sql, {
      id: newId('rnr'),
      accountId,
      name: `local ${sandboxId}`,
      tokenHash: hashSecret(token),
      tokenPrefix: token.slice(0, 12),
      kind: 'local',
    });
    const root = join(this.deps.root, accountId);
    mkdirSync(root, { recursive: true, mode: 0o700 });
    // The token travels in the environment, not the command line (ps shows arguments).
    const args = [RUNNER_BIN, '--url', this.deps.baseUrl(), '--root', root];
    args.push('--isolation', this.deps.isolation ?? 'namespaces');
    for (const path of this.deps.hidden ?? []) args.push('--hide', path);
    // Its turns run the service's RUNTIME_<NAME>_COMMAND lines: a failure names the service's.
    args.push('--local-provider');
    const child = spawn(process.execPath, args, {
      env: { PATH: runnerPath(process.env.PATH), HOME: process.env.HOME ?? root, SVC_RUNNER_TOKEN: token },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.children.set(sandboxId, { child, runnerId: runner.id });
    const log = this.deps.logger.child({ sandbox: sandboxId, runner: runner.id });
    const lines = (d: Buffer) => {
      for (const line of d.toString().split('\n')) if (line.trim()) log.debug(line);
    };
    child.stdout?.on('data', lines);
    child.stderr?.on('data', lines);
    child.on('exit', (code, signal) => {
      if (this.children.get(sandboxId)?.child === child) this.children.delete(sandboxId);
      log.info({ code, signal }, 'local runner-agent exited');
    });
    // Its pid outlives this process: a start after a crash tells a runner-agent that went
    // along from one that survived (lostAtStart).
    await this.pidFiles.write(runner.id, child.pid);
    const deadline = Date.now() + CONNECT_TIMEOUT_MS;
    while (!this.deps.fabric.isLive(runner.id)) {
      // A newer start for the sandbox may have replaced this one meanwhile: that one is left
      // alone. The service closing ends the wait at once (it must not outlive the service),
      // as does this one exiting (by a signal too, which leaves exitCode null).
      const replaced = this.children.get(sandboxId)?.child !== child;
      const exited = !replaced && (child.exitCode !== null || child.signalCode !== null);
      if (this.closing || exited || Date.now() > deadline) {
        if (!replaced) await this.stop(sandboxId);
        throw new ApiError('runner_offline', 'The local runner-agent did not connect.');
      }
      await new Promise((r) => setTimeout(r, 25));
    }
    return runner.id;
  }

  /**
   * Stops the sandbox's runner-agent and forgets its runner. With `runnerId`, only that
   * runner-agent (a newer one started for the sandbox meanwhile is left alone). With
   * `graceful`, waits until it has stopped its runtimes and exited (killed after
   * STOP_TIMEOUT_MS). The sandbox's directory stays either way (see removeDisk).
   */
  async stop(sandboxId: string, opts: { runnerId?: string | null; graceful?: boolean } = {}): Promise<void> {
    const held = this.children.get(sandboxId);
    if (!held || (opts.runnerId !== undefined && opts.runnerId !== held.runnerId)) return;
    this.children.delete(sandboxId);
    const { child } = held;
    const exited =
      child.exitCode !== null || child.signalCode !== null
        ? Promise.resolve()
        : new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    if (opts.graceful) {
      const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS);
      await exited;
      clearTimeout(timer);
    }
    await runners.deleteLocalRunner(this.deps.sql, held.runnerId).catch(() => {});
    await this.pidFiles.remove(held.runnerId);
  }

  /**
   * The runners of runner-agents started under this root by an earlier process of the service
   * whose process is gone and that are not connected now (each reported once): a power cut
   * or SIGKILL of the process group takes them along. One that survived (its process is
   * there) is left to reconnect, or to the adrift sweep.
   */
  async lostAtStart(): Promise<string[]> {
    const held = new Set(this.held().map((h) => h.runnerId));
    const lost: string[] = [];
    for (const { runnerId, pid } of await this.pidFiles.list()) {
      if (held.has(runnerId) || this.deps.fabric.isLive(runnerId) || processRunning(pid)) continue;
      await this.pidFiles.remove(runnerId);
      lost.push(runnerId);
    }
    return lost;
  }

  /** The sandboxes whose runner-agent runs on this node, with its runner. */
  held(): { sandboxId: string; runnerId: string; pid: number | undefined }[] {
    return [...this.children].map(([sandboxId, h]) => ({ sandboxId, runnerId: h.runnerId, pid: h.child.pid }));
  }

  /** Every machine this node runs. */
  async suspendable(): Promise<{ sandboxId: string; runnerId: string }[]> {
    return this.held();
  }

  /**
   * Removes a sandbox's directory (its disk) when no runner-agent holds it: a suspended
   * sandbox destroyed or reset has no runner to tell. Idempotent.
   */
  async removeDisk(accountId: string, sandboxId: string): Promise<void> {
    if (this.children.has(sandboxId)) return;
    // The runner-agent's layout under its --root (runner-agent/src/sandbox.ts, sandboxDir).
    await rm(join(this.deps.root, accountId, 'sandboxes', sandboxId), { recursive: true, force: true });
  }

  /** Removes everything the account's runner-agents kept under the root (see the port). */
  async eraseAccount(accountId: string): Promise<void> {
    await rm(join(this.deps.root, accountId), { recursive: true, force: true });
  }

  private get pidFiles() {
    return pidFilesIn(join(this.deps.root, 'runner-agents'));
  }

  async stopAll(): Promise<void> {
    this.closing = true;
    await Promise.all([...this.children.keys()].map((id) => this.stop(id)));
  }

  get running(): number {
    return this.children.size;
  }
}

/**
 * The PATH of a local runner-agent, which its runtimes and their sandboxes keep: the service's
 * own bin directories first, so the default RUNTIME_<NAME>_COMMAND lines (bare names such as
 * `claude-agent-acp`) find the CLIs the service ships however the service was started (`npm
 * start` puts them on PATH, `node gateway/start.mjs` in the image does not), then the
 * service's PATH, then the directory of the node running the service (most of the CLIs are
 * `#!/usr/bin/env node` scripts) when PATH lacks one. A command set to a path, or to another
 * name, is found as before.
 */
function runnerPath(path: string | undefined): string {
  const own = SHIPPED_BINS.filter((dir) => existsSync(dir));
  const rest = (path ?? '').split(delimiter).filter((dir) => dir && !own.includes(dir));
  const node = dirname(process.execPath);
  return [...own, ...rest, ...(rest.includes(node) ? [] : [node])].join(delimiter);
}

/** One file per runner-agent this node started, `<runner id>.pid`, holding its pid. */
function pidFilesIn(dir: string) {
  return {
    async write(runnerId: string, pid: number | undefined): Promise<void> {
      if (pid === undefined) return;
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      await writeFile(join(dir, `${runnerId}.pid`), `${pid}\n`);
    },
    async remove(runnerId: string): Promise<void> {
      await rm(join(dir, `${runnerId}.pid`), { force: true });
    },
    async list(): Promise<{ runnerId: string; pid: number }[]> {
      const names = await readdir(dir).catch(() => [] as string[]);
      const found: { runnerId: string; pid: number }[] = [];
      for (const name of names.filter((n) => n.endsWith('.pid'))) {
        const pid = Number.parseInt(await readFile(join(dir, name), 'utf8').catch(() => ''), 10);
        if (Number.isSafeInteger(pid) && pid > 0) found.push({ runnerId: name.slice(0, -'.pid'.length), pid });
      }
      return found;
    },
  };
}
