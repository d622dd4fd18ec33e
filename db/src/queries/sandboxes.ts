import { type Sql, transaction } from '../connect.ts';

export type SandboxStatus = 'provisioning' | 'ready' | 'suspended' | 'terminated' | 'failed';

export interface SandboxRow {
  id: string;
  account_id: string;
  provider: 'runner' | 'local' | 'sprites' | 'e2b' | 'daytona';
  mode: 'ephemeral' | 'persistent';
  status: SandboxStatus;
  runner_id: string | null;
  agent_id: string;
  environment_id: string | null;
  vault_id: string | null;
  incarnation: number;
  /** The incarnation its runner reported built; below `incarnation` (or null) means no machine. */
  built_incarnation: number | null;
  created_at: Date;
  updated_at: Date;
}

export async function insertSandbox(
  sql: Sql,
  s: {
    id: string;
    accountId: string;
    provider: SandboxRow['provider'];
    mode: SandboxRow['mode'];
    runnerId: string | null;
    agentId: string;
    environmentId: string | null;
    vaultId: string | null;
  },
): Promise<SandboxRow | undefined> {
  // DO NOTHING: a persistent machine for the same identity is live already (unique index).
  const rows = await sql<SandboxRow[]>`
    INSERT INTO sandboxes (id, account_id, provider, mode, runner_id, agent_id, environment_id, vault_id)
    VALUES (${s.id}, ${s.accountId}, ${s.provider}, ${s.mode}, ${s.runnerId}, ${s.agentId}, ${s.environmentId}, ${s.vaultId})
    ON CONFLICT DO NOTHING
    RETURNING *`;
  return rows[0];
}

/** The identity's live persistent machine (provisioning, ready or suspended), if it has one. */
export async function persistentFor(
  sql: Sql,
  accountId: string,
  identity: { agentId: string; environmentId: string | null; vaultId: string | null },
): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`
    SELECT * FROM sandboxes
    WHERE account_id = ${accountId} AND agent_id = ${identity.agentId} AND mode = 'persistent'
      AND coalesce(environment_id, '') = ${identity.environmentId ?? ''} AND coalesce(vault_id, '') = ${identity.vaultId ?? ''}
      AND status IN ('provisioning', 'ready', 'suspended')`;
  return rows[0];
}

export async function getSandbox(sql: Sql, accountId: string, id: string): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`SELECT * FROM sandboxes WHERE account_id = ${accountId} AND id = ${id}`;
  return rows[0];
}

/** The sandbox if it is on this runner (a runner speaks only for its own sandboxes). */
export async function onRunner(sql: Sql, runnerId: string, id: string): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`SELECT * FROM sandboxes WHERE runner_id = ${runnerId} AND id = ${id}`;
  return rows[0];
}

/** Moves the status when it is still `from` (compare-and-set: two nodes never both move it). */
export async function moveStatus(sql: Sql, id: string, from: SandboxStatus[], to: SandboxStatus): Promise<boolean> {
  const rows = await sql`UPDATE sandboxes SET status = ${to}, updated_at = now()
                         WHERE id = ${id} AND status = ANY(${from}) RETURNING id`;
  return rows.length === 1;
}

/** Conversations on the sandbox (a runner's output may name only these). */
export async function conversationIds(sql: Sql, accountId: string, sandboxId: string): Promise<string[]> {
  const rows = await sql<{ id: string }[]>`
    SELECT id FROM conversations WHERE account_id = ${accountId} AND sandbox_id = ${sandboxId}`;
  return rows.map((r) => r.id);
}

/** The runner a sandbox lives on, once it has one (a local sandbox gets its runner after start). */
export async function setRunner(sql: Sql, id: string, runnerId: string): Promise<void> {
  await sql`UPDATE sandboxes SET runner_id = ${runnerId}, updated_at = now() WHERE id = ${id}`;
}

/**
 * Starts the next incarnation of a sandbox whose machine is gone: a clean machine for the
 * same identity, on `runnerId`. Compare-and-set on the status the caller saw; undefined when
 * it moved meanwhile.
 */
export async function rebuild(
  sql: Sql,
  id: string,
  runnerId: string | null,
  from: SandboxStatus,
  /** False when the current incarnation was never built (a reset left it without a machine). */
  next = true,
): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`
    UPDATE sandboxes SET status = 'provisioning', incarnation = incarnation + ${next ? 1 : 0}, runner_id = ${runnerId},
                         updated_at = now()
    WHERE id = ${id} AND status = ${from} RETURNING *`;
  return rows[0];
}
/** Statuses that hold a machine or will: they count against the quota and the fleet. */
export const ACTIVE_STATUSES: SandboxStatus[] = ['provisioning', 'ready', 'suspended'];

/** A sandbox as listed: its row, its runner's presence facts and its conversations. */
export interface SandboxView extends SandboxRow {
  runner_name: string | null;
  runner_hostname: string | null;
  runner_path: string | null;
  runner_connected: boolean | null;
  runner_last_seen_at: Date | null;
  conversations: { id: string; mid_turn: boolean }[];
}

function selectViews(sql: Sql) {
  return sql`
    SELECT s.*, r.name AS runner_name, r.hostname AS runner_hostname, r.path AS runner_path,
      r.connected AS runner_connected, r.last_seen_at AS runner_last_seen_at,
      coalesce((SELECT json_agg(json_build_object('id', c.id, 'mid_turn', c.status = 'running') ORDER BY c.created_at, c.id)
                FROM conversations c WHERE c.account_id = s.account_id AND c.sandbox_id = s.id), '[]'::json) AS conversations
    FROM sandboxes s LEFT JOIN runners r ON r.id = s.runner_id`;
}

/** The tenant's sandboxes, newest first, optionally only those in `statuses`. */
export async function listSandboxes(
  sql: Sql,
  accountId: string,
  statuses: SandboxStatus[] | undefined,
): Promise<SandboxView[]> {
  return sql<SandboxView[]>`
    ${selectViews(sql)}
    WHERE s.account_id = ${accountId} ${statuses?.length ? sql`AND s.status = ANY(${statuses})` : sql``}
    ORDER BY s.created_at DESC, s.id DESC`;
}

export async function getSandboxView(sql: Sql, accountId: string, id: string): Promise<SandboxView | undefined> {
  const rows = await sql<SandboxView[]>`${selectViews(sql)} WHERE s.account_id = ${accountId} AND s.id = ${id}`;
  return rows[0];
}

/**
 * The runner reported incarnation `incarnation` of the sandbox built: it becomes `ready` with
 * that machine. Compare-and-set on status and incarnation: a build of a machine that was since
 * reset, or of a sandbox that failed or ended meanwhile, changes nothing.
 */
export async function markBuilt(sql: Sql, id: string, incarnation: number): Promise<boolean> {
  const rows = await sql`
    UPDATE sandboxes SET status = 'ready', built_incarnation = ${incarnation}, updated_at = now()
    WHERE id = ${id} AND incarnation = ${incarnation} AND status IN ('provisioning', 'ready') RETURNING id`;
  return rows.length === 1;
}

/** The build of incarnation `incarnation` failed: the sandbox is `failed` (same compare-and-set). */
export async function markBuildFailed(sql: Sql, id: string, incarnation: number): Promise<boolean> {
  const rows = await sql`
    UPDATE sandboxes SET status = 'failed', updated_at = now()
    WHERE id = ${id} AND incarnation = ${incarnation} AND status IN ('provisioning', 'ready') RETURNING id`;
  return rows.length === 1;
}

/**
 * Active sandboxes of the account and of the whole instance, counted under a transaction-level
 * advisory lock that every sandbox-creating transaction takes first: two launches cannot both
 * count below a limit and both insert. Must run inside the transaction that inserts.
 */
export async function lockAndCountActive(tx: Sql, accountId: string): Promise<{ account: number; fleet: number }> {
  await tx`SELECT pg_advisory_xact_lock(hashtext('svc:sandbox-capacity'))`;
  const rows = await tx<{ account: number; fleet: number }[]>`
    SELECT count(*) FILTER (WHERE account_id = ${accountId})::int AS account, count(*)::int AS fleet
    FROM sandboxes WHERE status = ANY(${ACTIVE_STATUSES})`;
  return rows[0] ?? { account: 0, fleet: 0 };
}

export type ResetOutcome =
  | { outcome: 'not_found' }
  | { outcome: 'not_resettable'; row: SandboxRow }
  | { outcome: 'mid_turn'; row: SandboxRow; conversations: string[] }
  | { outcome: 'reset'; row: SandboxRow; incarnation: number };

/**
 * Resets a persistent sandbox in `from` statuses, atomically with the mid-turn check: the
 * sandbox row and every conversation on it are locked (FOR UPDATE), so a turn that starts
 * concurrently (it sets its conversation `running`) either committed first and is seen here,
 * or waits until the reset has committed and then finds the new incarnation. On success the
 * incarnation goes up (a clean machine for the same identity) and the sandbox is `ready`
 * without a machine (`built_incarnation` stays below `incarnation`); conversations are kept.
 */
export async function resetSandbox(
  sql: Sql,
  accountId: string,
  id: string,
  from: SandboxStatus[],
): Promise<ResetOutcome> {
  return transaction(sql, async (tx) => {
    const [row] = await tx<SandboxRow[]>`
      SELECT * FROM sandboxes WHERE account_id = ${accountId} AND id = ${id} FOR UPDATE`;
    if (!row) return { outcome: 'not_found' };
    if (row.mode !== 'persistent' || !from.includes(row.status)) return { outcome: 'not_resettable', row };
    const on = await tx<{ id: string; status: string }[]>`
      SELECT id, status FROM conversations WHERE account_id = ${accountId} AND sandbox_id = ${id}
      ORDER BY id FOR UPDATE`;
    const running = on.filter((c) => c.status === 'running').map((c) => c.id);
    if (running.length) return { outcome: 'mid_turn', row, conversations: running };
    const [next] = await tx<{ incarnation: number }[]>`
      UPDATE sandboxes SET incarnation = incarnation + 1, status = 'ready', updated_at = now()
      WHERE id = ${id} RETURNING incarnation`;
    return { outcome: 'reset', row, incarnation: (next as { incarnation: number }).incarnation };
  });
}

/**
 * Persistent sandboxes of the account that still hold or will hold a machine built for the
 * given identity parts (every part given must match).
 */
export async function persistentBuiltOn(
  sql: Sql,
  accountId: string,
  on: { agentId?: string | undefined; environmentId?: string | undefined; vaultId?: string | undefined },
): Promise<string[]> {
  const rows = await sql<{ id: string }[]>`
    SELECT id FROM sandboxes
    WHERE account_id = ${accountId} AND mode = 'persistent' AND status = ANY(${ACTIVE_STATUSES})
      ${on.agentId ? sql`AND agent_id = ${on.agentId}` : sql``}
      ${on.environmentId ? sql`AND environment_id = ${on.environmentId}` : sql``}
      ${on.vaultId ? sql`AND vault_id = ${on.vaultId}` : sql``}
    ORDER BY created_at, id`;
  return rows.map((r) => r.id);
}

/**
 * Suspends the sandbox when it is still idle: `ready` with its machine built, no conversation
 * on it running a turn, and no turn on it started or ended after `idleSince`. The sandbox row
 * and its conversations are locked (FOR UPDATE) as a reset does, so a turn starting at the
 * same moment either committed first and is seen here, or finds the sandbox `suspended` after
 * this commits. A suspended sandbox lives on no runner (its runner-agent is being stopped;
 * a wake starts another), so `runner_id` is cleared with the move, unless `keepRunner` (a
 * tenant's runner: it stays connected and keeps the disk the wake adopts). Returns the row
 * (as it was before, with its runner) and its live (not terminated) conversations, or
 * undefined when it is not idle any more (or another node suspended it first).
 */
export async function suspendIfIdle(
  sql: Sql,
  id: string,
  idleSince: Date,
  options: { keepRunner?: boolean } = {},
): Promise<{ row: SandboxRow; conversations: string[] } | undefined> {
  return transaction(sql, async (tx) => {
    const [row] = await tx<SandboxRow[]>`SELECT * FROM sandboxes WHERE id = ${id} FOR UPDATE`;
    if (row?.status !== 'ready' || (row.built_incarnation ?? -1) < row.incarnation) return undefined;
    const on = await tx<{ id: string; status: string }[]>`
      SELECT id, status FROM conversations WHERE account_id = ${row.account_id} AND sandbox_id = ${id}
      ORDER BY id FOR UPDATE`;
    if (on.some((c) => c.status === 'running')) return undefined;
    const [last] = await tx<{ at: Date | null }[]>`
      SELECT max(greatest(t.created_at, coalesce(t.ended_at, now()))) AS at
      FROM turns t JOIN conversations c ON c.id = t.conversation_id
      WHERE c.account_id = ${row.account_id} AND c.sandbox_id = ${id}`;
    const lastActive = last?.at && last.at > row.updated_at ? last.at : row.updated_at;
    if (lastActive > idleSince) return undefined;
    const [moved] = await tx<SandboxRow[]>`
      UPDATE sandboxes SET status = 'suspended', updated_at = now(),
        runner_id = ${options.keepRunner ? tx`runner_id` : tx`NULL`}
      WHERE id = ${id} RETURNING *`;
    return {
      row: { ...(moved as SandboxRow), runner_id: row.runner_id },
      conversations: on.filter((c) => c.status !== 'terminated').map((c) => c.id),
    };
  });
}

/**
 * Of the sandbox directories a runner of `accountId` keeps (`ids`), those no active sandbox
 * (provisioning, ready or suspended) of the account has: terminated or deleted while it was
 * away, or failed. One active on another runner of the account is not among them (two runners
 * may share a root). Each with the incarnation to name in its destroy (0 for one gone).
 */
export async function orphanedOnRunner(
  sql: Sql,
  accountId: string,
  ids: string[],
): Promise<{ id: string; incarnation: number }[]> {
  if (ids.length === 0) return [];
  const rows = await sql<{ id: string; status: SandboxStatus; incarnation: number }[]>`
    SELECT id, status, incarnation FROM sandboxes WHERE account_id = ${accountId} AND id = ANY(${ids}::text[])`;
  const of = new Map(rows.map((r) => [r.id, r]));
  return ids
    .filter((id) => !ACTIVE_STATUSES.includes(of.get(id)?.status as SandboxStatus))
    .map((id) => ({ id, incarnation: of.get(id)?.incarnation ?? 0 }));
}

/** The `ready` sandboxes of `provider` on these runners, with their runner, oldest first. */
export async function readyOnRunners(
  sql: Sql,
  provider: string,
  runnerIds: string[],
): Promise<{ id: string; runner_id: string }[]> {
  if (runnerIds.length === 0) return [];
  return sql<{ id: string; runner_id: string }[]>`
    SELECT id, runner_id FROM sandboxes
    WHERE provider = ${provider} AND status = 'ready' AND runner_id = ANY(${runnerIds}::text[])
    ORDER BY created_at, id`;
}

/**
 * The status of the sandbox, read under a share lock inside the caller's transaction: a
 * suspension (which locks the row for update) either committed before it or waits for the
 * caller's commit.
 */
export async function statusForShare(tx: Sql, id: string): Promise<SandboxStatus | undefined> {
  const rows = await tx<{ status: SandboxStatus }[]>`SELECT status FROM sandboxes WHERE id = ${id} FOR SHARE`;
  return rows[0]?.status;
}

/**
 * A runner connected holding `held`: each of its built, `ready` sandboxes it does not hold
 * (an earlier process of it built them and is gone, with their runtimes) moves to `suspended`
 * when its directory is still under the runner's root (`kept`: the next prompt wakes it there,
 * so `runner_id` stays), else to `failed`. Returns each sandbox moved (as it is now) and its
 * live (not terminated) conversations.
 */
export async function settleUnheld(
  sql: Sql,
  runnerId: string,
  held: string[],
  kept: string[],
): Promise<{ row: SandboxRow; conversations: string[] }[]> {
  return transaction(sql, async (tx) => {
    const rows = await tx<SandboxRow[]>`
      SELECT * FROM sandboxes
      WHERE runner_id = ${runnerId} AND status = 'ready' AND coalesce(built_incarnation, -1) >= incarnation
        AND id <> ALL(${held}::text[])
      ORDER BY id FOR UPDATE`;
    const moved: { row: SandboxRow; conversations: string[] }[] = [];
    for (const row of rows) {
      const status: SandboxStatus = kept.includes(row.id) ? 'suspended' : 'failed';
      const [now] = await tx<SandboxRow[]>`
        UPDATE sandboxes SET status = ${status}, updated_at = now() WHERE id = ${row.id} RETURNING *`;
      const on = await tx<{ id: string }[]>`
        SELECT id FROM conversations
        WHERE account_id = ${row.account_id} AND sandbox_id = ${row.id} AND status <> 'terminated' ORDER BY id`;
      moved.push({ row: now as SandboxRow, conversations: on.map((c) => c.id) });
    }
    return moved;
  });
}

/**
 * The runner is being deleted (inside that transaction): its sandboxes that hold or will hold
 * a machine there move to `failed`, since that machine is gone for good. Returns each moved
 * and its live (not terminated) conversations.
 */
export async function failOnRunner(tx: Sql, runnerId: string): Promise<{ row: SandboxRow; conversations: string[] }[]> {
  const rows = await tx<SandboxRow[]>`
    UPDATE sandboxes SET status = 'failed', updated_at = now()
    WHERE runner_id = ${runnerId} AND status IN ('provisioning', 'ready', 'suspended') RETURNING *`;
  const moved: { row: SandboxRow; conversations: string[] }[] = [];
  for (const row of rows) {
    const on = await tx<{ id: string }[]>`
      SELECT id FROM conversations
      WHERE account_id = ${row.account_id} AND sandbox_id = ${row.id} AND status <> 'terminated' ORDER BY id`;
    moved.push({ row, conversations: on.map((c) => c.id) });
  }
  return moved;
}
