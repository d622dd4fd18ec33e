import { type AdminAction, ApiError, RUNNER_CLOSE, validationFailed } from '@svc/core';
import { admin, type Sql, sandboxes } from '@svc/db';
import { type AccountDeps, type AccountErasureDeps, eraseAccount } from './accounts.ts';
import { getUser, shapeUser } from './admin-users.ts';
import { terminateConversation } from './launch.ts';
import type { LaunchDeps } from './launch-deps.ts';
import type { ActorRef, Principal } from './principal.ts';
import { destroySandbox } from './sandboxes.ts';

/**
 * Operator administration (role admin and a full-scope key, checked by the route's auth level).
 * Every change is written to the privilege trail (`admin_events`: who, what, to whom, when).
 * What crosses a tenant here is metadata: counts, states, ids, never prompt or output content.
 */
export interface AdminDeps {
  sql: Sql;
  launch: LaunchDeps;
  erasure: AccountErasureDeps;
  /** An erased account's export files go with it. */
  exportFiles: AccountDeps['exportFiles'];
  /** A suspension, role change or erasure ends what every node remembers of the account's keys. */
  credentialCache: AccountDeps['credentialCache'];
}

function shapeSandbox(r: admin.AdminSandboxRow) {
  return { ...r, status: r.status as sandboxes.SandboxStatus, created_at: r.created_at.toISOString() };
}

const paging = (q: { page: number; per_page: number }) => ({ limit: q.per_page, offset: (q.page - 1) * q.per_page });
const meta = (q: { page: number; per_page: number }, total: number) => ({ page: q.page, per_page: q.per_page, total });

export async function listUsers(
  sql: Sql,
  q: Omit<admin.AdminUserFilter, 'limit' | 'offset'> & { page: number; per_page: number },
) {
  const { rows, total } = await admin.listUsers(sql, { ...q, ...paging(q) });
  return { data: rows.map(shapeUser), meta: meta(q, total) };
}

/** SPEC: an admin cannot suspend, delete or change the role of their own account. */
function refuseSelf(p: Principal, id: string, what: string): void {
  if (p.accountId === id) {
    throw validationFailed(
      { id: [`an admin cannot ${what} their own account; ask another admin`] },
      `An admin cannot ${what} their own account; ask another admin.`,
    );
  }
}

async function record(
  sql: Sql,
  p: Principal,
  action: AdminAction,
  target: ['account' | 'sandbox', string],
  metadata = {},
) {
  await admin.insertAdminEvent(sql, {
    adminId: p.accountId,
    action,
    targetType: target[0],
    targetId: target[1],
    metadata,
    requestIp: p.ip,
  });
}

async function change(sql: Sql, id: string, c: Parameters<typeof admin.updateUser>[2]) {
  if (!(await admin.updateUser(sql, id, c))) throw new ApiError('not_found', 'No account has that id.');
}

export async function setRole(
  deps: Pick<AdminDeps, 'sql' | 'credentialCache'>,
  p: Principal,
  id: string,
  role: 'user' | 'admin',
) {
  refuseSelf(p, id, 'change the role of');
  const before = await getUser(deps.sql, id);
  await change(deps.sql, id, { role });
  await deps.credentialCache.forgetAccount(id);
  await record(deps.sql, p, 'admin.user.role', ['account', id], { from: before.role, to: role });
  return getUser(deps.sql, id);
}

/** The account's own active-sandbox limit; null returns it to SANDBOX_QUOTA_DEFAULT. */
export async function setSandboxLimit(sql: Sql, p: Principal, id: string, limit: number | null) {
  const before = await getUser(sql, id);
  await change(sql, id, { sandbox_limit: limit });
  await record(sql, p, 'admin.user.sandbox_limit', ['account', id], { from: before.sandbox_limit, to: limit });
  return getUser(sql, id);
}

/**
 * Suspends (or restores) an account. From the commit on, every key and session of it is
 * refused with 403 `account_suspended` and its runners' tokens with 401; then each of its
 * active sandboxes is reaped (its conversations terminated, its machine destroyed through its
 * provider) and its connected runners are closed, so nothing of it keeps running. Restoring
 * restarts nothing: its owner launches again and restarts their runners.
 */
export async function setSuspended(deps: AdminDeps, p: Principal, id: string, suspended: boolean) {
  refuseSelf(p, id, 'suspend');
  await getUser(deps.sql, id);
  await change(deps.sql, id, { suspended });
  await deps.credentialCache.forgetAccount(id);
  let stopped = 0;
  if (suspended) {
    try {
      for (const s of await sandboxes.listSandboxes(deps.sql, id, sandboxes.ACTIVE_STATUSES)) {
        await reap(deps, id, s.id, 'account suspended');
        stopped++;
      }
    } finally {
      // After the reaps (a runner is told to destroy its machines), and even when one failed:
      // its own runners are refused at connect while it is suspended, those connected now go,
      // and its open streams end, on every node.
      await deps.erasure.fabric.disconnectEverywhere(
        { accountId: id },
        RUNNER_CLOSE.revoked,
        'the account was suspended',
      );
    }
  }
  await record(deps.sql, p, 'admin.user.suspend', ['account', id], { suspended, sandboxes_stopped: stopped });
  return getUser(deps.sql, id);
}

/** Erases the account exactly as `DELETE /api/account` does, without its owner's confirmation. */
export async function deleteUser(deps: AdminDeps, p: Principal, id: string): Promise<void> {
  refuseSelf(p, id, 'delete');
  await getUser(deps.sql, id);
  await eraseAccount(
    { sql: deps.sql, log: deps.launch.logger, exportFiles: deps.exportFiles, credentialCache: deps.credentialCache },
    deps.erasure,
    id,
  );
  await record(deps.sql, p, 'admin.user.delete', ['account', id]);
}

/** The privilege trail, newest first. */
export async function listEvents(sql: Sql, q: { page: number; per_page: number }) {
  const { rows, total } = await admin.listAdminEvents(sql, paging(q));
  return {
    data: rows.map((e) => ({
      ...e,
      created_at: e.created_at.toISOString(),
    })),
    meta: meta(q, total),
  };
}

export async function listSandboxes(
  sql: Sql,
  q: { page: number; per_page: number; account_id?: string | undefined; status?: sandboxes.SandboxStatus | undefined },
) {
  const { rows, total } = await admin.listAllSandboxes(sql, {
    accountId: q.account_id,
    statuses: q.status ? [q.status] : undefined,
    ...paging(q),
  });
  return { data: rows.map(shapeSandbox), meta: meta(q, total) };
}

/**
 * Reaps any account's sandbox: its live conversations are terminated (a running turn ends
 * `interrupted`), the sandbox becomes `terminated`, and its machine is destroyed through its
 * provider. Reaping a sandbox that already ended destroys again (idempotent) and changes
 * nothing else. 404 `sandbox_not_found` for an unknown id.
 */
export async function reapSandbox(deps: AdminDeps, p: Principal, id: string) {
  const found = await admin.getAnySandbox(deps.sql, id);
  if (!found) throw new ApiError('sandbox_not_found');
  const before = await reap(deps, found.account_id, id, 'admin reap');
  await record(deps.sql, p, 'admin.sandbox.reap', ['sandbox', id], {
    account_id: found.account_id,
    status_before: before,
  });
  return shapeSandbox((await admin.getAnySandbox(deps.sql, id)) ?? found);
}

async function reap(deps: AdminDeps, accountId: string, id: string, why: string): Promise<string> {
  const system: ActorRef = { accountId, actor: 'system', ip: null };
  const row = await sandboxes.getSandbox(deps.sql, accountId, id);
  if (!row) throw new ApiError('sandbox_not_found');
  for (const conversationId of await sandboxes.conversationIds(deps.sql, accountId, id)) {
    await terminateConversation(deps.launch, system, conversationId).catch((err: unknown) => {
      if (!(err instanceof ApiError && err.code === 'conversation_terminated')) throw err;
    });
  }
  await sandboxes.moveStatus(deps.sql, id, ['provisioning', 'ready', 'suspended', 'failed'], 'terminated');
  await destroySandbox(deps.erasure, row, why);
  return row.status;
}
