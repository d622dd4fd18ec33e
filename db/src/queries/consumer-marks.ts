import type { Sql } from '../connect.ts';

/** How far the tenant's webhook consumer has taken its log; undefined when it never started. */
export async function consumedUpTo(sql: Sql, accountId: string): Promise<number | undefined> {
  const rows = await sql<{ consumed_id: string }[]>`
    SELECT consumed_id FROM webhook_consumer_marks WHERE account_id = ${accountId}`;
  return rows[0] ? Number(rows[0].consumed_id) : undefined;
}

/** The tenants with a mark: those whose group some consumer made and has not removed. */
export async function consumedTenants(sql: Sql): Promise<string[]> {
  return (await sql<{ account_id: string }[]>`SELECT account_id FROM webhook_consumer_marks`).map((r) => r.account_id);
}

/** Records that everything up to `id` was consumed; never moves the mark back. */
export async function recordConsumed(sql: Sql, accountId: string, id: number): Promise<void> {
  await sql`
    INSERT INTO webhook_consumer_marks (account_id, consumed_id) VALUES (${accountId}, ${id})
    ON CONFLICT (account_id) DO UPDATE
    SET consumed_id = GREATEST(webhook_consumer_marks.consumed_id, excluded.consumed_id)`;
}

/** Forgets the mark (the tenant has no endpoints any more); idempotent. */
export async function forgetConsumed(sql: Sql, accountId: string): Promise<void> {
  await sql`DELETE FROM webhook_consumer_marks WHERE account_id = ${accountId}`;
}

/**
 * Since when (epoch ms) the account has had active webhook endpoints, as far as the rows tell:
 * the earliest last change (creation, resume) among them; undefined without one.
 */
export async function endpointsActiveSince(sql: Sql, accountId: string): Promise<number | undefined> {
  const rows = await sql<{ since: number | null }[]>`
    SELECT (extract(epoch FROM min(updated_at)) * 1000)::float8 AS since
    FROM webhook_endpoints WHERE account_id = ${accountId} AND status = 'active'`;
  const since = rows[0]?.since;
  return since === null || since === undefined ? undefined : Math.floor(since);
}
