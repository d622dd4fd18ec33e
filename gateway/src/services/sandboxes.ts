import { ApiError, type RunnerCommandBody, SANDBOX_STATUSES } from '@svc/core';
import { admin, outbox, type Sql, sandboxes } from '@svc/db';
import type { Logger } from 'pino';
import { runnerOnline } from '../fabric/presence.ts';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import { recordAudit } from './audit.ts';
import { csv } from './list-params.ts';
import type { ActorRef } from './principal.ts';
import { stageEvent } from './stage-events.ts';

/** What a retirement is about: the identity sandboxes were built for. */
export interface RetireTarget {
  accountId: string;
  environmentId?: string;
  vaultId?: string;
  agentId?: string;
  reason: 'agent_environment_changed' | 'environment_deleted' | 'vault_deleted';
}

/**
 * The seam every change that invalidates a machine goes through (SPEC: a persistent sandbox
 * is retired like a reset when its agent's environment changes or its environment or vault
 * is deleted; a machine mid-turn is left until the turn ends). Resolves to how many sandboxes
 * were retired.
 */
export type RetireSandboxesBuiltOn = (target: RetireTarget) => Promise<number>;

/** What resetting a sandbox needs: its row, and the fabric to destroy the machine. */
export interface SandboxDeps {
  sql: Sql;
  /** The runner fabric's side this needs (RunnerFabric). */
  fabric: { command(runnerId: string, body: RunnerCommandBody): Promise<void>; isLive(runnerId: string): boolean };
  logger: Logger;
  /** A sandbox without a runner to tell (suspended) has its disk removed by its provider. */
  providers: SandboxProviders;
}

/**
 * The wire shape; `runner` only where the provider places sandboxes on tenant runners, online
 * by the rule of GET /api/runners.
 */
export function shapeSandbox(
  v: sandboxes.SandboxView,
  offlineAfterMs: number,
  providers: SandboxProviders,
  now = Date.now(),
) {
  const runner = !providers.of(v.provider).showsRunner
    ? {}
    : {
        runner:
          v.runner_id === null || v.runner_name === null
            ? null
            : {
                id: v.runner_id,
                name: v.runner_name,
                hostname: v.runner_hostname,
                online: runnerOnline(v.runner_connected ?? false, v.runner_last_seen_at, offlineAfterMs, now),
                path: v.runner_path,
              },
      };
  return {
    id: v.id,
    status: v.status,
    mode: v.mode,
    provider: v.provider,
    // No provider of this instance gives a machine an address of its own yet.
    url: null,
    agent_id: v.agent_id,
    environment_id: v.environment_id,
    vault_id: v.vault_id,
    conversations: v.conversations,
    ...runner,
    created_at: v.created_at.toISOString(),
  };
}

/** The tenant's sandboxes, newest first; a status outside the vocabulary is 400 `invalid_status`. */
export async function listSandboxes(sql: Sql, accountId: string, status: string | undefined) {
  const statuses = csv(
    status,
    SANDBOX_STATUSES,
    () => new ApiError('invalid_status', `status is one of ${SANDBOX_STATUSES.join(', ')}.`),
  );
  return sandboxes.listSandboxes(sql, accountId, statuses);
}

export async function getSandbox(sql: Sql, accountId: string, id: string) {
  const view = await sandboxes.getSandboxView(sql, accountId, id);
  if (!view) throw new ApiError('sandbox_not_found');
  return view;
}

/**
 * `DELETE /api/sandboxes/:id`: resets a persistent sandbox that is ready or suspended and has
 * no conversation mid-turn (checked atomically with the reset, see `sandboxes.resetSandbox`).
 * Its machine is destroyed on its runner; the sandbox stays `ready` with a new incarnation and
 * no machine, so the next prompt builds a clean one for the same agent, environment and vault;
 * its conversations are kept. 422 `sandbox_not_resettable` for ephemeral, terminated or failed
 * sandboxes; 409 `sandbox_mid_turn`; 503 `provisioning` while its first machine is still being
 * built; 503 `runner_offline` when its runner is not connected (nothing changes then, so the
 * machine is never left behind on a runner that comes back).
 */
export async function resetSandbox(deps: SandboxDeps, who: ActorRef, id: string): Promise<void> {
  const current = await getSandbox(deps.sql, who.accountId, id);
  if (current.mode === 'persistent' && current.status === 'provisioning') {
    if (current.conversations.some((c) => c.mid_turn)) throw midTurn();
    throw new ApiError('provisioning', 'The sandbox’s machine is still being built; reset it once it is ready.');
  }
  if (current.runner_id !== null && !deps.fabric.isLive(current.runner_id)) {
    if (current.mode === 'persistent' && (current.status === 'ready' || current.status === 'suspended')) {
      throw new ApiError('runner_offline', 'The runner this sandbox lives on is offline; reset it once it is back.');
    }
  }
  const result = await sandboxes.resetSandbox(deps.sql, who.accountId, id, ['ready', 'suspended']);
  if (result.outcome === 'not_found') throw new ApiError('sandbox_not_found');
  if (result.outcome === 'not_resettable') {
    throw new ApiError(
      'sandbox_not_resettable',
      result.row.mode !== 'persistent'
        ? 'Only a persistent sandbox can be reset; an ephemeral one goes with its conversation.'
        : `A ${result.row.status} sandbox cannot be reset.`,
    );
  }
  if (result.outcome === 'mid_turn') throw midTurn(result.conversations);
  await destroyMachine(deps, result.row);
  await recordAudit(
    deps.sql,
    who,
    'sandbox.reset',
    { type: 'sandbox', id },
    { incarnation: result.incarnation, conversations: current.conversations.length },
  );
}

function midTurn(conversations?: string[]): ApiError {
  return new ApiError('sandbox_mid_turn', undefined, conversations ? { extra: { conversations } } : {});
}

/**
 * Tells the sandbox's runner to destroy the machine of the incarnation that was just replaced.
 * Best effort after the commit: a runner that went away in between keeps a stale directory,
 * which is logged (the database already says the machine is gone).
 */
async function destroyMachine(deps: SandboxDeps, row: sandboxes.SandboxRow, why = 'sandbox reset'): Promise<void> {
  if (row.runner_id === null) {
    // A suspended sandbox: its machine was stopped, its kept disk goes now.
    await deps.providers
      .of(row.provider)
      .destroy(row)
      .catch((err: Error) =>
        deps.logger.warn({ err: { message: err.message }, sandbox: row.id }, `${why}: disk not removed`),
      );
    return;
  }
  try {
    await deps.fabric.command(row.runner_id, {
      kind: 'sandbox.destroy',
      sandbox: row.id,
      incarnation: row.incarnation,
    });
  } catch (err) {
    deps.logger.warn(
      { err: { message: (err as Error).message }, sandbox: row.id, runner: row.runner_id },
      `${why}: the runner could not be told to destroy the machine`,
    );
  }
}

/**
 * The retire seam, filled: each persistent sandbox built on the target (the agent on its old
 * environment, the environment, the vault) is reset like `DELETE /api/sandboxes/:id`, also
 * while it is still provisioning and whether or not its runner is connected (a machine on a
 * runner that is away is logged and left). A sandbox with a conversation mid-turn is left as
 * it is, and logged: its machine keeps serving the turn. Each retirement is audited as the
 * service's own action. Resolves to how many were retired.
 */
export function retireSandboxesBuiltOn(deps: SandboxDeps): RetireSandboxesBuiltOn {
  return async (target) => {
    if (!target.agentId && !target.environmentId && !target.vaultId) return 0;
    const ids = await sandboxes.persistentBuiltOn(deps.sql, target.accountId, target);
    const system: ActorRef = { accountId: target.accountId, actor: 'system', ip: null };
    let retired = 0;
    for (const id of ids) {
      const result = await sandboxes.resetSandbox(deps.sql, target.accountId, id, sandboxes.ACTIVE_STATUSES);
      if (result.outcome === 'mid_turn') {
        deps.logger.info(
          { sandbox: id, reason: target.reason, conversations: result.conversations },
          'sandbox not retired: a conversation on it is mid-turn',
        );
        continue;
      }
      if (result.outcome !== 'reset') continue;
      await destroyMachine(deps, result.row);
      await recordAudit(
        deps.sql,
        system,
        'sandbox.retired',
        { type: 'sandbox', id },
        { reason: target.reason, incarnation: result.incarnation },
      );
      retired++;
    }
    return retired;
  };
}

/**
 * Account deletion, before its rows go: each sandbox's runner, when it has one, is told to
 * destroy the machine (as a reset does), then its provider stops what it runs for it and
 * removes what it keeps, and last every provider erases what it still keeps for the account.
 * Best effort per sandbox and logged: the account goes either way, and a self-hosted runner
 * that is away when told keeps a directory no one can reach.
 */
export async function destroyAccountSandboxes(deps: SandboxDeps, accountId: string): Promise<void> {
  for (const row of await sandboxes.listSandboxes(deps.sql, accountId, undefined)) {
    await destroySandbox(deps, row, 'account deletion');
  }
  for (const provider of deps.providers.all) await provider.eraseAccount(accountId);
}

/**
 * Destroys one sandbox's machine through its provider: its runner, when it has one, is told
 * to destroy the machine, then the provider stops what it runs for it and removes what it
 * keeps. Best effort and logged; the caller has already moved the row (terminated, or gone).
 */
export async function destroySandbox(deps: SandboxDeps, row: sandboxes.SandboxRow, why: string): Promise<void> {
  if (row.status !== 'terminated' && row.runner_id !== null) await destroyMachine(deps, row, why);
  await deps.providers
    .of(row.provider)
    .destroy(row)
    .catch((err: Error) =>
      deps.logger.warn({ err: { message: err.message }, sandbox: row.id }, `${why}: not destroyed`),
    );
}

/** SANDBOX_QUOTA_DEFAULT and FLEET_MAX_SANDBOXES. */
export interface SandboxLimits {
  quota: number;
  fleetMax: number;
}

/** How long a client is told to wait before it retries a launch refused for capacity. */
const CAPACITY_RETRY_AFTER_S = 30;

/**
 * Refuses a new sandbox beyond the account's quota (429 `sandbox_quota_exceeded` with `active`
 * and `limit`) or the instance's fleet ceiling (503 `fleet_full`), both with Retry-After.
 * Active means provisioning, ready or suspended. Call it first inside the transaction that
 * inserts the sandbox: it takes the capacity lock, so concurrent launches count one at a time
 * and a refusal rolls the whole launch back.
 */
export async function checkCapacity(tx: Sql, accountId: string, limits: SandboxLimits): Promise<void> {
  const active = await sandboxes.lockAndCountActive(tx, accountId);
  // An admin-set limit (POST /api/admin/users/:id/sandbox-limit) replaces the instance default.
  const limit = (await admin.sandboxLimitOf(tx, accountId)) ?? limits.quota;
  if (active.account >= limit) {
    throw new ApiError(
      'sandbox_quota_exceeded',
      `The account has ${active.account} active sandboxes, its limit is ${limit}: end or reset one first.`,
      { extra: { active: active.account, limit }, retryAfter: CAPACITY_RETRY_AFTER_S },
    );
  }
  if (active.fleet >= limits.fleetMax) {
    throw new ApiError('fleet_full', undefined, { retryAfter: CAPACITY_RETRY_AFTER_S });
  }
}

/**
 * The runner reported the end of a sandbox build (stage `sandbox` done or failed, in the log):
 * the sandbox becomes `ready` with that machine, or `failed` (compare-and-set on status and
 * incarnation, so a late report about a replaced machine changes nothing).
 */
export async function sandboxBuilt(sql: Sql, id: string, incarnation: number, ok: boolean): Promise<boolean> {
  return ok ? sandboxes.markBuilt(sql, id, incarnation) : sandboxes.markBuildFailed(sql, id, incarnation);
}

/** What a conversation hears when its sandbox's runner came back without its machine. */
const AFTER_RUNNER_RESTART = {
  kept: JSON.stringify({
    reason: 'the runner restarted, and its runtimes with it',
    disk: 'kept',
    wake: 'the next prompt wakes it (stage reattach); its runtime session starts afresh',
  }),
  gone: 'The runner restarted without this sandbox: its directory is gone from the runner. The next prompt builds it again from the start (a new incarnation, on an empty disk).',
};

/**
 * A runner connected holding `held`, with the directories of `kept` under its root (inside the
 * transaction `tx` that records the connection): its sandboxes it no longer holds (a restart
 * lost their machines) are settled (sandboxes.settleUnheld), and each live conversation on one
 * hears what comes next: a kept one is woken by the next prompt (stage `suspend` done), one
 * whose directory is gone is built again by it (stage `reattach` failed, and the sandbox is
 * `failed` at once).
 */
export async function settleRunnerSandboxes(tx: Sql, runnerId: string, held: string[], kept: string[]): Promise<void> {
  for (const { row, conversations } of await sandboxes.settleUnheld(tx, runnerId, held, kept)) {
    const event =
      row.status === 'suspended'
        ? (id: string) => stageEvent(id, null, 'suspend', 'done', AFTER_RUNNER_RESTART.kept)
        : (id: string) => stageEvent(id, null, 'reattach', 'failed', AFTER_RUNNER_RESTART.gone);
    await outbox.enqueue(tx, row.account_id, conversations.map(event));
  }
}
