import { ApiError } from '@svc/core';
import { type Sql, sandboxes } from '@svc/db';
import type { SandboxProviders } from '../sandboxes/provider.ts';

/** What `machineOf` found: whether the sandbox's machine must be built or woken first, and on which runner. */
export interface Machine {
  /** Built again first: its machine failed, was destroyed or is lost, or its incarnation was never built. */
  gone: boolean;
  /** Its incarnation has no machine yet (a reset or a retirement left it `ready` without one). */
  unbuilt: boolean;
  /** Suspended: its machine was stopped and its disk kept; it is woken, not built. */
  asleep: boolean;
  /** The runner it runs (or is rebuilt) on; null when its provider makes the machine itself. */
  runnerId: string | null;
}

/** A `ready` sandbox whose incarnation was never built (a reset or a retirement left it without a machine). */
export function unbuiltMachine(sandbox: Pick<sandboxes.SandboxRow, 'status' | 'incarnation' | 'built_incarnation'>) {
  return sandbox.status === 'ready' && (sandbox.built_incarnation ?? -1) < sandbox.incarnation;
}

/**
 * Whether the sandbox's machine can take a turn as it is, or must be built again first (its
 * machine failed or was destroyed, or is lost, as a local runner-agent after a restart), and
 * on which runner. 503 `runner_offline` when the machine is away and may come back.
 */
export async function machineOf(
  deps: { providers: SandboxProviders },
  accountId: string,
  sandbox: sandboxes.SandboxRow,
): Promise<Machine> {
  const provider = deps.providers.of(sandbox.provider);
  const health = await provider.health(sandbox);
  const unbuilt = unbuiltMachine(sandbox);
  // Suspended by the idle worker, or by its runner's restart: its disk is kept, it is woken.
  const asleep = sandbox.status === 'suspended';
  const gone =
    unbuilt || sandbox.status === 'failed' || sandbox.status === 'terminated' || (health === 'lost' && !asleep);
  let runnerId = sandbox.runner_id;
  if (health === 'away') {
    if (!gone) throw new ApiError('runner_offline', 'The runner this sandbox lives on is not connected.');
    runnerId = await provider.place(accountId);
  }
  return { gone, unbuilt, asleep, runnerId };
}

/**
 * Inside the transaction that puts a conversation or a turn on an existing sandbox: settles the
 * machine `machineOf` saw against what happened since. A sandbox suspended meanwhile (the
 * suspension locks the row; this waits for it or comes first) is woken rather than sent a turn
 * its stopping machine would drop. A machine that is gone or asleep makes the sandbox's next
 * incarnation (a wake too: its runner-agent numbers output afresh), compare-and-set on the
 * status seen: when another request started building it meanwhile, 503 `provisioning` (retry
 * shortly), and the caller's transaction rolls back. Resolves to the sandbox row to run on and
 * the machine as settled.
 */
export async function claimMachine(
  tx: Sql,
  deps: { providers: SandboxProviders },
  sandbox: sandboxes.SandboxRow,
  machine: Machine,
): Promise<{ sandbox: sandboxes.SandboxRow; machine: Machine }> {
  let row = sandbox;
  let asleep = machine.asleep;
  if (deps.providers.of(row.provider).suspends && !machine.gone && !asleep) {
    if ((await sandboxes.statusForShare(tx, row.id)) === 'suspended') {
      asleep = true;
      row = { ...row, status: 'suspended' };
    }
  }
  if (machine.gone || asleep) {
    // Asleep, it keeps the runner its disk is on (none for a machine the provider starts itself).
    const rebuilt = await sandboxes.rebuild(
      tx,
      row.id,
      asleep ? row.runner_id : machine.runnerId,
      row.status,
      !machine.unbuilt,
    );
    if (!rebuilt) throw new ApiError('provisioning', 'The sandbox is being built again; try again shortly.');
    row = rebuilt;
  }
  return { sandbox: row, machine: { ...machine, asleep } };
}

/**
 * The runner that serves the sandbox for what comes next, from its provider: a woken machine
 * (`wake`), one for a build (`create`), or the one it has (`adopt`). The sandbox records it
 * when it changed. Rejects as the provider does (503 `runner_offline`).
 */
export async function machineRunner(
  deps: { sql: Sql; providers: SandboxProviders },
  sandbox: sandboxes.SandboxRow,
  how: 'wake' | 'create' | 'adopt',
): Promise<string> {
  const provider = deps.providers.of(sandbox.provider);
  const runnerId = await provider[how](sandbox);
  if (runnerId !== sandbox.runner_id) await sandboxes.setRunner(deps.sql, sandbox.id, runnerId);
  return runnerId;
}
