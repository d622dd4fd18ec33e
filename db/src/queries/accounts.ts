import type { Sql } from '../connect.ts';

export interface AccountRow {
  id: string;
  email: string;
  password_hash: string;
  role: 'user' | 'admin';
  email_verified_at: Date | null;
  session_version: number;
  onboarding_state: string;
  onboarding_completed_at: Date | null;
  comped: boolean;
  brokered: boolean;
  suspended: boolean;
  data_key: Uint8Array;
  created_at: Date;
  updated_at: Date;
}

export async function insertAccount(
  sql: Sql,
  a: { id: string; email: string; passwordHash: string; role: 'user' | 'admin'; dataKey: Uint8Array },
): Promise<AccountRow | undefined> {
  const rows = await sql<AccountRow[]>`
    INSERT INTO accounts (id, email, password_hash, role, data_key)
    VALUES (${a.id}, ${a.email}, ${a.passwordHash}, ${a.role}, ${a.dataKey})
    ON CONFLICT ((lower(email))) DO NOTHING
    RETURNING *`;
  return rows[0];
}

export async function findAccountByEmail(sql: Sql, email: string): Promise<AccountRow | undefined> {
  const rows = await sql<AccountRow[]>`SELECT * FROM accounts WHERE lower(email) = lower(${email})`;
  return rows[0];
}

export async function findAccountById(sql: Sql, id: string): Promise<AccountRow | undefined> {
  const rows = await sql<AccountRow[]>`SELECT * FROM accounts WHERE id = ${id}`;
  return rows[0];
}

/**
 * Whether the account is suspended, read under a share lock on its row: inside a transaction
 * that records new work, a suspension (an UPDATE of that row) either committed before, and is
 * seen here, or waits until this transaction commits, and then finds the work it must stop.
 * Undefined when there is no such account.
 */
export async function suspendedForShare(tx: Sql, id: string): Promise<boolean | undefined> {
  const rows = await tx<{ suspended: boolean }[]>`SELECT suspended FROM accounts WHERE id = ${id} FOR SHARE`;
  return rows[0]?.suspended;
}

export async function markEmailVerified(sql: Sql, id: string): Promise<void> {
  await sql`UPDATE accounts SET email_verified_at = coalesce(email_verified_at, now()), updated_at = now()
            WHERE id = ${id}`;
}

/**
 * Sets a new password hash. `bumpSessionVersion` signs out every session and OAuth-issued key
 * (password reset); without it only the caller removes browser sessions (password change).
 */
export async function setPasswordHash(
  sql: Sql,
  id: string,
  passwordHash: string,
  bumpSessionVersion: boolean,
): Promise<void> {
  await sql`UPDATE accounts SET password_hash = ${passwordHash},
              session_version = session_version + ${bumpSessionVersion ? 1 : 0}, updated_at = now()
            WHERE id = ${id}`;
}

/** Completes an email change; signs out every session. False when the address was taken meanwhile. */
export async function changeEmail(sql: Sql, id: string, email: string): Promise<boolean> {
  const rows = await sql`
    UPDATE accounts SET email = ${email}, email_verified_at = coalesce(email_verified_at, now()),
      session_version = session_version + 1, updated_at = now()
    WHERE id = ${id} AND NOT EXISTS (SELECT 1 FROM accounts WHERE lower(email) = lower(${email}) AND id <> ${id})
    RETURNING id`;
  return rows.length === 1;
}

export async function completeOnboarding(sql: Sql, id: string): Promise<AccountRow> {
  const rows = await sql<AccountRow[]>`
    UPDATE accounts SET onboarding_state = 'completed',
      onboarding_completed_at = coalesce(onboarding_completed_at, now()), updated_at = now()
    WHERE id = ${id} RETURNING *`;
  return rows[0] as AccountRow;
}

/** Promotes existing accounts whose address is listed (ADMIN_EMAILS); returns their ids. */
export async function promoteAdmins(sql: Sql, emails: readonly string[]): Promise<string[]> {
  if (emails.length === 0) return [];
  const rows = await sql<{ id: string }[]>`
    UPDATE accounts SET role = 'admin', updated_at = now()
    WHERE lower(email) = ANY(${emails.map((e) => e.toLowerCase())}) AND role <> 'admin' RETURNING id`;
  return rows.map((r) => r.id);
}

/**
 * Deletes the account row; every tenant-owned table cascades from it, and the wrapped data
 * key goes with the row, so nothing encrypted under it can be read again.
 */
/** Every account's id (the log copier checks each tenant once at start). */
export async function allAccountIds(sql: Sql): Promise<string[]> {
  return (await sql<{ id: string }[]>`SELECT id FROM accounts`).map((r) => r.id);
}

export async function deleteAccount(sql: Sql, id: string): Promise<boolean> {
  const rows = await sql`DELETE FROM accounts WHERE id = ${id} RETURNING id`;
  return rows.length === 1;
}

/** Every table of the schema that has an `account_id` column (for erasure checks). */
export async function tenantTables(sql: Sql): Promise<string[]> {
  const rows = await sql<{ table_name: string }[]>`
    SELECT table_name FROM information_schema.columns
    WHERE column_name = 'account_id' AND table_schema = current_schema()
    ORDER BY table_name`;
  return rows.map((r) => r.table_name);
}

export async function countRowsOfAccount(sql: Sql, table: string, accountId: string): Promise<number> {
  const rows = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM ${sql(table)} WHERE account_id = ${accountId}`;
  return rows[0]?.n ?? 0;
}
