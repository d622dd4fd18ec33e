import type { Sql } from '../connect.ts';

/** One request that left a sandbox through the broker, as the runner reports it. */
export interface EgressInsert {
  accountId: string;
  conversationId: string;
  at: Date;
  host: string;
  port: number;
  method: string;
  bindingId: string | null;
  status: number | null;
  latencyMs: number | null;
  refused: boolean;
  reason: string | null;
}

export interface EgressLogRow {
  /** The row's id (an identity, in insertion order): the cursor pages move by. */
  id: number;
  at: Date;
  host: string;
  port: number;
  method: string;
  binding_id: string | null;
  status: number | null;
  latency_ms: number | null;
  refused: boolean;
  reason: string | null;
}

/**
 * Appends `rows` in one statement, ids in the order given. Resolves to how many were written
 * (all or none: a row naming a conversation that is gone fails the whole insert).
 */
export async function insertEgressRows(sql: Sql, rows: EgressInsert[]): Promise<number> {
  if (rows.length === 0) return 0;
  const values = rows.map((r) => ({
    account_id: r.accountId,
    conversation_id: r.conversationId,
    at: r.at,
    host: r.host,
    port: r.port,
    method: r.method,
    binding_id: r.bindingId,
    status: r.status,
    latency_ms: r.latencyMs,
    refused: r.refused,
    reason: r.reason,
  }));
  const result = await sql`INSERT INTO egress_log ${sql(values)}`;
  return result.count;
}

/**
 * The conversation's rows, newest first, `limit + 1` of them so the caller knows there are
 * more; `before` (an id) pages backwards. Another account's conversation has none.
 */
export async function listEgress(
  sql: Sql,
  accountId: string,
  conversationId: string,
  o: { limit: number; before?: number | undefined },
): Promise<EgressLogRow[]> {
  const rows = await sql<(Omit<EgressLogRow, 'id'> & { id: string })[]>`
    SELECT id, at, host, port, method, binding_id, status, latency_ms, refused, reason FROM egress_log
    WHERE conversation_id = ${conversationId} AND account_id = ${accountId}
      ${o.before === undefined ? sql`` : sql`AND id < ${o.before}`}
    ORDER BY id DESC LIMIT ${o.limit + 1}`;
  // bigint arrives as text; ids stay far below 2^53.
  return rows.map((r) => ({ ...r, id: Number(r.id) }));
}

/**
 * Deletes the rows of conversations that ended (were terminated) more than `retentionHours`
 * ago; rows of live conversations stay whatever their age. A conversation's end is its
 * `last_active_at`, which terminating stamps and nothing moves afterwards. Deletes in batches,
 * so no pass holds a long transaction; resolves to how many rows went. Idempotent.
 */
export async function sweepEgressLog(sql: Sql, retentionHours: number, batch = 5000): Promise<number> {
  let deleted = 0;
  for (;;) {
    const result = await sql`
      DELETE FROM egress_log WHERE id IN (
        SELECT l.id FROM conversations c JOIN egress_log l ON l.conversation_id = c.id
        WHERE c.status = 'terminated' AND c.last_active_at < now() - make_interval(hours => ${retentionHours}::int)
        LIMIT ${batch})`;
    deleted += result.count;
    if (result.count < batch) return deleted;
  }
}
