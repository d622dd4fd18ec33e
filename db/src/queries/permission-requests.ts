import type postgres from 'postgres';
import type { Sql } from '../connect.ts';

export type PermissionResolution = 'answered' | 'policy' | 'timeout' | 'turn_end' | 'interrupted';

export interface PermissionRequestRow {
  id: string;
  account_id: string;
  conversation_id: string;
  turn_id: string | null;
  options: { optionId: string; name: string; kind: string }[];
  status: 'pending' | 'resolved';
  resolution: PermissionResolution | null;
  option_id: string | null;
  created_at: Date;
  resolved_at: Date | null;
}

/**
 * Records a request that waits for an answer. Idempotent: a request already recorded (a
 * runner resending its output) is left as it is, resolved or not.
 */
export async function insertPending(
  sql: Sql,
  r: {
    id: string;
    accountId: string;
    conversationId: string;
    turnId: string | null;
    options: PermissionRequestRow['options'];
  },
): Promise<void> {
  await sql`
    INSERT INTO permission_requests (id, account_id, conversation_id, turn_id, options)
    VALUES (${r.id}, ${r.accountId}, ${r.conversationId}, ${r.turnId},
            ${sql.json(r.options as unknown as postgres.JSONValue)})
    ON CONFLICT (account_id, id) DO NOTHING`;
}

/** One request of a conversation of the tenant (undefined for another tenant's). */
export async function getRequest(
  sql: Sql,
  accountId: string,
  conversationId: string,
  id: string,
): Promise<PermissionRequestRow | undefined> {
  const rows = await sql<PermissionRequestRow[]>`
    SELECT * FROM permission_requests
    WHERE account_id = ${accountId} AND conversation_id = ${conversationId} AND id = ${id}`;
  return rows[0];
}

/**
 * The first answer wins: resolves a pending request with the option (compare-and-set on
 * status). Undefined when it was no longer pending.
 */
export async function answer(
  sql: Sql,
  accountId: string,
  id: string,
  optionId: string,
): Promise<PermissionRequestRow | undefined> {
  const rows = await sql<PermissionRequestRow[]>`
    UPDATE permission_requests
    SET status = 'resolved', resolution = 'answered', option_id = ${optionId}, resolved_at = now()
    WHERE account_id = ${accountId} AND id = ${id} AND status = 'pending'
    RETURNING *`;
  return rows[0];
}

/**
 * Undoes an answer that could not be delivered (its runner was offline), so a later answer
 * may win; only while the row still holds exactly that answer.
 */
export async function reopen(sql: Sql, accountId: string, id: string, optionId: string): Promise<void> {
  await sql`
    UPDATE permission_requests SET status = 'pending', resolution = NULL, option_id = NULL, resolved_at = NULL
    WHERE account_id = ${accountId} AND id = ${id} AND status = 'resolved'
      AND resolution = 'answered' AND option_id = ${optionId}`;
}

/**
 * Records how the runner resolved a request: the runtime's answer is the last word, so this
 * overwrites an answer the runner no longer took (it had timed out meanwhile). The time of
 * the first resolution is kept.
 */
export async function resolvedOnRunner(
  sql: Sql,
  accountId: string,
  id: string,
  resolution: PermissionResolution,
  optionId: string | null,
): Promise<void> {
  await sql`
    UPDATE permission_requests
    SET status = 'resolved', resolution = ${resolution}, option_id = ${optionId},
        resolved_at = coalesce(resolved_at, now())
    WHERE account_id = ${accountId} AND id = ${id}
      AND (status = 'pending' OR resolution IS DISTINCT FROM ${resolution} OR option_id IS DISTINCT FROM ${optionId})`;
}

/**
 * Resolves every request of the turn still pending as `turn_end` (nothing stays pending once
 * its turn ended); returns the requests it resolved.
 */
export async function expireForTurn(sql: Sql, accountId: string, turnId: string): Promise<PermissionRequestRow[]> {
  return sql<PermissionRequestRow[]>`
    UPDATE permission_requests
    SET status = 'resolved', resolution = 'turn_end', resolved_at = now()
    WHERE account_id = ${accountId} AND turn_id = ${turnId} AND status = 'pending'
    RETURNING *`;
}
