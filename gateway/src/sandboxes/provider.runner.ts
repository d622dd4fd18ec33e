import { ApiError } from '@svc/core';
import { runners, type Sql } from '@svc/db';
import { RUNNER_STAYED_AWAY, runnerOnline } from '../services/runners.ts';
import type { MachineHealth, SandboxProvider, SandboxRef } from './provider.ts';

/**
 * The `runner` sandbox provider: sandboxes live on the tenant's own connected runners
 * (`svc-runner`), which build and destroy machines themselves when the fabric tells them to.
 * It never starts or stops a machine, and never suspends an idle one; a sandbox its runner
 * came back without (a restart) is suspended on its kept disk and woken there. A runner may be
 * connected to any node, so presence is read as GET /api/runners shows it (connected, heard
 * from lately).
 */
export function runnerProvider(deps: {
  sql: Sql;
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
    suspends: false,
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
    async suspend() {
      throw new Error('the service does not suspend sandboxes on a runner');
    },
    // The runner removed the machine when told `sandbox.destroy`; nothing is held here.
    async destroy() {},
    // What a runner keeps is on the tenant's machine, removed there when told sandbox.destroy.
    async eraseAccount() {},
    held: () => [],
    // A tenant's runner is not this node's to lose: it reconnects, or the grace runs out.
    lostAtStart: async () => [],
  };
}
