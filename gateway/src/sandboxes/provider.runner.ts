import { ApiError, RUNNER_CAN_SUSPEND } from '@svc/core';
import { runners, type Sql, sandboxes } from '@svc/db';
import type { RunnerFabric } from '../fabric/fabric.ts';
import { RUNNER_STAYED_AWAY, runnerOnline } from '../fabric/presence.ts';
import type { MachineHealth, SandboxProvider, SandboxRef } from './provider.ts';

/**
 * The `runner` sandbox provider: sandboxes live on the tenant's own connected runners
 * (`svc-runner`), which build, suspend and destroy machines themselves when the fabric tells
 * them to. It never starts or stops a runner. An idle sandbox is suspended on its runner (its
 * runtimes stop, the runner stays connected and keeps the disk), as is one its runner came
 * back without (a restart); either is woken there. A runner may be connected to any node, so
 * presence is read as GET /api/runners shows it (connected, heard from lately); the node a
 * runner is connected to suspends its idle sandboxes.
 */
export function runnerProvider(deps: {
  sql: Sql;
  fabric: Pick<RunnerFabric, 'command' | 'liveWith'>;
  /** Runners heard from within this long count as online. */
  offlineAfterMs: number;
}): SandboxProvider {
  const online = (r: runners.RunnerRow) => runnerOnline(r.connected, r.last_seen_at, deps.offlineAfterMs, Date.now());
  const held = (sandbox: SandboxRef) => {
    if (sandbox.runner_id === null) throw new ApiError('runner_offline', 'The sandbox has no runner.');
    return sandbox.runner_id;
  };
  return {
    name: 'runner',
    suspends: true,
    suspendKeepsRunner: true,
    showsRunner: true,
    // A sandbox is placed on a connected runner before it is recorded: nothing starts.
    startTimeoutMs: 0,
    adrift: {
      state: 'failed',
      // The same words as when the grace runs out on the runner's node: it is the same event.
      error: RUNNER_STAYED_AWAY,
      reason: 'runner_gone',
    },
    async place(accountId) {
      const runner = (await runners.listRunners(deps.sql, accountId)).find(online);
      if (!runner) {
        throw new ApiError('no_runner_online', 'No runner of this account is online: start svc-runner first.');
      }
      return runner.id;
    },
    async health(sandbox): Promise<MachineHealth> {
      const runner = sandbox.runner_id ? await runners.getRunnerById(deps.sql, sandbox.runner_id) : undefined;
      return runner !== undefined && online(runner) ? 'live' : 'away';
    },
    // The runner placed on builds the machine when told `sandbox.create`.
    create: async (sandbox) => held(sandbox),
    adopt: async (sandbox) => held(sandbox),
    // A sandbox its runner no longer held when it connected (it restarted) is woken there,
    // on the disk it kept (`sandbox.create` with `adopt`).
    wake: async (sandbox) => held(sandbox),
    // Acknowledged once the runner has it; the runner then stops the sandbox's runtimes.
    async suspend(sandbox, runnerId) {
      await deps.fabric.command(runnerId, {
        kind: 'sandbox.suspend',
        sandbox: sandbox.id,
        incarnation: sandbox.incarnation,
      });
    },
    // The runner removed the machine when told `sandbox.destroy`; nothing is held here.
    async destroy() {},
    // What a runner keeps is on the tenant's machine, removed there when told sandbox.destroy.
    async eraseAccount() {},
    held: () => [],
    // Ready sandboxes on the runners connected here that take `sandbox.suspend` (a runner of
    // an older release keeps its runtimes until it restarts).
    async suspendable() {
      const rows = await sandboxes.readyOnRunners(deps.sql, 'runner', deps.fabric.liveWith(RUNNER_CAN_SUSPEND));
      return rows.map((r) => ({ sandboxId: r.id, runnerId: r.runner_id }));
    },
    // A tenant's runner is not this node's to lose: it reconnects, or the grace runs out.
    lostAtStart: async () => [],
  };
}
