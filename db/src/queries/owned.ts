import type { Sql } from '../connect.ts';

/**
 * Tables of resources an account owns by id: every row carries `account_id`, and a row of
 * another account is never seen, so its id reads as unknown.
 */
export type OwnedTable = 'agents' | 'environments' | 'vaults';

/**
 * Whether a row of the account other than `id` already carries `name` (these tables are unique
 * on `(account_id, name)`): an update that renames `id` to it would clash.
 */
export async function nameTakenByAnother(
  sql: Sql,
  table: OwnedTable,
  accountId: string,
  name: string,
  id: string,
): Promise<boolean> {
  const rows =
    await sql`SELECT 1 FROM ${sql(table)} WHERE account_id = ${accountId} AND name = ${name} AND id <> ${id}`;
  return rows.length > 0;
}

/** Deletes the account's row `id`; false when the account has no such row. */
export async function deleteOwned(sql: Sql, table: OwnedTable, accountId: string, id: string): Promise<boolean> {
  const rows = await sql`DELETE FROM ${sql(table)} WHERE account_id = ${accountId} AND id = ${id} RETURNING id`;
  return rows.length === 1;
}
