import type { Sql } from '../connect.ts';
import { deleteOwned, nameTakenByAnother } from './owned.ts';

export interface VaultRow {
  id: string;
  name: string;
  secret_count: number;
  created_at: Date;
  updated_at: Date;
}

function selectWithCounts(sql: Sql) {
  return sql`
    SELECT v.*, (SELECT count(*)::int FROM vault_secrets s WHERE s.vault_id = v.id) AS secret_count
    FROM vaults v`;
}

/** Inserts; undefined when the account already has a vault of that name. */
export async function insertVault(
  sql: Sql,
  accountId: string,
  id: string,
  name: string,
): Promise<VaultRow | undefined> {
  const rows = await sql`INSERT INTO vaults (id, account_id, name) VALUES (${id}, ${accountId}, ${name})
                         ON CONFLICT (account_id, name) DO NOTHING RETURNING id`;
  return rows.length ? getVault(sql, accountId, id) : undefined;
}

export async function renameVault(
  sql: Sql,
  accountId: string,
  id: string,
  name: string,
): Promise<VaultRow | undefined | 'conflict'> {
  if (await nameTakenByAnother(sql, 'vaults', accountId, name, id)) return 'conflict';
  const rows = await sql`UPDATE vaults SET name = ${name}, updated_at = now()
                         WHERE account_id = ${accountId} AND id = ${id} RETURNING id`;
  return rows.length ? getVault(sql, accountId, id) : undefined;
}

export async function getVault(sql: Sql, accountId: string, id: string): Promise<VaultRow | undefined> {
  const rows = await sql<VaultRow[]>`${selectWithCounts(sql)} WHERE v.account_id = ${accountId} AND v.id = ${id}`;
  return rows[0];
}

export async function findVaultByName(sql: Sql, accountId: string, name: string): Promise<VaultRow | undefined> {
  const rows = await sql<VaultRow[]>`${selectWithCounts(sql)} WHERE v.account_id = ${accountId} AND v.name = ${name}`;
  return rows[0];
}

export async function listVaults(sql: Sql, accountId: string): Promise<VaultRow[]> {
  return sql<VaultRow[]>`${selectWithCounts(sql)} WHERE v.account_id = ${accountId} ORDER BY v.created_at, v.id`;
}

export async function deleteVault(sql: Sql, accountId: string, id: string): Promise<boolean> {
  return deleteOwned(sql, 'vaults', accountId, id);
}

/** The ids among `ids` that are vaults of the account. */
export async function existingVaultIds(sql: Sql, accountId: string, ids: readonly string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await sql<
    { id: string }[]
  >`SELECT id FROM vaults WHERE account_id = ${accountId} AND id = ANY(${ids as string[]})`;
  return new Set(rows.map((r) => r.id));
}
