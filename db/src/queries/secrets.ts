import type { Sql } from '../connect.ts';

/**
 * Secrets of environments and vaults share one shape; `owner` names the table pair. Every
 * query is scoped by account and owner id. Ciphertexts leave this module only for the
 * service that decrypts them into a sandbox (or compares them in bulk apply).
 */
export type SecretOwner = 'environment' | 'vault';

const TABLE = { environment: 'environment_secrets', vault: 'vault_secrets' } as const;
const OWNER_COLUMN = { environment: 'environment_id', vault: 'vault_id' } as const;

export interface SecretRow {
  id: string;
  key: string;
  ciphertext: Uint8Array;
  expires_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

export async function listSecrets(
  sql: Sql,
  owner: SecretOwner,
  accountId: string,
  ownerId: string,
): Promise<SecretRow[]> {
  const expires = owner === 'vault' ? sql`expires_at` : sql`NULL::timestamptz AS expires_at`;
  return sql<SecretRow[]>`
    SELECT id, key, ciphertext, ${expires}, created_at, updated_at FROM ${sql(TABLE[owner])}
    WHERE account_id = ${accountId} AND ${sql(OWNER_COLUMN[owner])} = ${ownerId}
    ORDER BY key`;
}

/** Inserts or replaces the value of `key`; `created` tells which. */
export async function upsertSecret(
  sql: Sql,
  owner: SecretOwner,
  s: { id: string; accountId: string; ownerId: string; key: string; ciphertext: Uint8Array; expiresAt?: Date | null },
): Promise<SecretRow & { created: boolean }> {
  const table = sql(TABLE[owner]);
  const column = sql(OWNER_COLUMN[owner]);
  const rows =
    owner === 'vault'
      ? await sql<(SecretRow & { created: boolean })[]>`
          INSERT INTO ${table} (id, account_id, ${column}, key, ciphertext, expires_at)
          VALUES (${s.id}, ${s.accountId}, ${s.ownerId}, ${s.key}, ${s.ciphertext}, ${s.expiresAt ?? null})
          ON CONFLICT (${column}, key) DO UPDATE
            SET ciphertext = excluded.ciphertext, expires_at = excluded.expires_at, updated_at = now()
          RETURNING id, key, ciphertext, expires_at, created_at, updated_at, (xmax = 0) AS created`
      : await sql<(SecretRow & { created: boolean })[]>`
          INSERT INTO ${table} (id, account_id, ${column}, key, ciphertext)
          VALUES (${s.id}, ${s.accountId}, ${s.ownerId}, ${s.key}, ${s.ciphertext})
          ON CONFLICT (${column}, key) DO UPDATE SET ciphertext = excluded.ciphertext, updated_at = now()
          RETURNING id, key, ciphertext, NULL::timestamptz AS expires_at, created_at, updated_at, (xmax = 0) AS created`;
  return rows[0] as SecretRow & { created: boolean };
}

export async function deleteSecret(
  sql: Sql,
  owner: SecretOwner,
  accountId: string,
  ownerId: string,
  key: string,
): Promise<string | undefined> {
  const rows = await sql<{ id: string }[]>`
    DELETE FROM ${sql(TABLE[owner])}
    WHERE account_id = ${accountId} AND ${sql(OWNER_COLUMN[owner])} = ${ownerId} AND key = ${key}
    RETURNING id`;
  return rows[0]?.id;
}
