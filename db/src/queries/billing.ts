import type { Sql } from '../connect.ts';

/*
 * The credit ledger (migration 024): append-only rows in cents; an account's balance is the
 * sum of its rows. Nothing here updates or deletes a row.
 */

/** The account's balance in cents: the sum of its ledger rows (0 with none). */
export async function balance(sql: Sql, accountId: string): Promise<number> {
  const [row] = await sql<{ cents: string }[]>`
    SELECT coalesce(sum(cents), 0)::bigint AS cents FROM credit_ledger WHERE account_id = ${accountId}`;
  return Number(row?.cents ?? 0);
}

export interface MonthUsage {
  /** Conversations that ran a turn (a turn opened) in the month. */
  conversations: number;
  /** Credit turn charges took in the month, in cents (positive). */
  creditBurnedCents: number;
  /** Metered time of the turns that ended in the month, in milliseconds. */
  turnMs: number;
}

/** The account's usage in the calendar month (UTC) holding `at`. */
export async function monthUsage(sql: Sql, accountId: string, at: Date): Promise<MonthUsage> {
  const [row] = await sql<{ conversations: number; burned: string; turn_ms: string }[]>`
    WITH month AS (SELECT date_trunc('month', ${at}::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS start)
    SELECT
      (SELECT count(DISTINCT conversation_id)::int FROM turns, month
        WHERE account_id = ${accountId} AND created_at >= month.start AND created_at < month.start + interval '1 month')
        AS conversations,
      (SELECT coalesce(-sum(cents), 0)::bigint FROM credit_ledger, month
        WHERE account_id = ${accountId} AND kind = 'turn'
          AND created_at >= month.start AND created_at < month.start + interval '1 month') AS burned,
      (SELECT coalesce(sum(floor(extract(epoch FROM ended_at - created_at) * 1000)), 0)::bigint FROM turns, month
        WHERE account_id = ${accountId} AND ended_at >= month.start AND ended_at < month.start + interval '1 month')
        AS turn_ms`;
  return {
    conversations: row?.conversations ?? 0,
    creditBurnedCents: Number(row?.burned ?? 0),
    turnMs: Number(row?.turn_ms ?? 0),
  };
}

/**
 * Charges an ended turn its metered time (created_at to ended_at) at `centsPerHour`, rounded
 * up to a whole cent. Exactly once per turn (unique `turn_id`): a second call charges nothing.
 * Nothing is charged for a turn still running, another account's turn, or a comped account.
 * Resolves to the cents charged now (positive), or null when nothing was charged.
 */
export async function chargeTurn(
  sql: Sql,
  accountId: string,
  turnId: string,
  centsPerHour: number,
): Promise<number | null> {
  const rows = await sql<{ cents: string }[]>`
    INSERT INTO credit_ledger (account_id, kind, cents, turn_id, turn_ms)
    SELECT t.account_id, 'turn', -ceil(m.ms * ${centsPerHour}::numeric / 3600000)::bigint, t.id, m.ms
    FROM turns t
    JOIN accounts a ON a.id = t.account_id
    CROSS JOIN LATERAL (SELECT floor(extract(epoch FROM t.ended_at - t.created_at) * 1000)::bigint AS ms) m
    WHERE t.account_id = ${accountId} AND t.id = ${turnId} AND t.ended_at IS NOT NULL AND NOT a.comped
    ON CONFLICT (turn_id) DO NOTHING
    RETURNING cents`;
  return rows[0] ? -Number(rows[0].cents) : null;
}

/**
 * Credits a purchase the payment provider confirmed in event `eventId`: once per event
 * (unique `provider_event_id`). False when the event was already applied or the account no
 * longer exists.
 */
export async function recordPurchase(
  sql: Sql,
  p: { accountId: string; cents: number; eventId: string; note: string },
): Promise<boolean> {
  const rows = await sql`
    INSERT INTO credit_ledger (account_id, kind, cents, provider_event_id, note)
    SELECT id, 'purchase', ${p.cents}, ${p.eventId}, ${p.note} FROM accounts WHERE id = ${p.accountId}
    ON CONFLICT (provider_event_id) DO NOTHING
    RETURNING id`;
  return rows.length > 0;
}

/**
 * Appends an operator's grant (`cents` may be negative to take credit back). False when the
 * account does not exist.
 */
export async function grant(sql: Sql, accountId: string, cents: number, note: string): Promise<boolean> {
  const rows = await sql`
    INSERT INTO credit_ledger (account_id, kind, cents, note)
    SELECT id, 'grant', ${cents}, ${note} FROM accounts WHERE id = ${accountId}
    RETURNING id`;
  return rows.length > 0;
}

/** Marks the account comped (never charged, never gated) or not. False when it does not exist. */
export async function setComped(sql: Sql, accountId: string, comped: boolean): Promise<boolean> {
  const rows =
    await sql`UPDATE accounts SET comped = ${comped}, updated_at = now() WHERE id = ${accountId} RETURNING id`;
  return rows.length > 0;
}
