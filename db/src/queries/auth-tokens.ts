import type { Sql } from '../connect.ts';

export type TokenPurpose = 'verify' | 'reset' | 'email_change';

export interface AuthTokenRow {
  id: string;
  account_id: string;
  purpose: TokenPurpose;
  new_email: string | null;
  expires_at: Date;
  used_at: Date | null;
  expired: boolean;
}

export async function insertAuthToken(
  sql: Sql,
  t: {
    id: string;
    accountId: string;
    purpose: TokenPurpose;
    tokenHash: Uint8Array;
    expiresAt: Date;
    newEmail?: string;
  },
): Promise<void> {
  await sql`INSERT INTO auth_tokens (id, account_id, purpose, token_hash, new_email, expires_at)
            VALUES (${t.id}, ${t.accountId}, ${t.purpose}, ${t.tokenHash}, ${t.newEmail ?? null}, ${t.expiresAt})`;
}

export async function findAuthToken(
  sql: Sql,
  purpose: TokenPurpose,
  tokenHash: Uint8Array,
): Promise<AuthTokenRow | undefined> {
  const rows = await sql<AuthTokenRow[]>`
    SELECT id, account_id, purpose, new_email, expires_at, used_at, expires_at <= now() AS expired
    FROM auth_tokens WHERE token_hash = ${tokenHash} AND purpose = ${purpose}`;
  return rows[0];
}

/** Marks the token used; false when another request used it first (single use). */
export async function useAuthToken(sql: Sql, id: string): Promise<boolean> {
  const rows = await sql`UPDATE auth_tokens SET used_at = now()
                         WHERE id = ${id} AND used_at IS NULL AND expires_at > now() RETURNING id`;
  return rows.length === 1;
}

/** Retires the account's unused tokens of a purpose, so only the newest link works. */
export async function retireAuthTokens(sql: Sql, accountId: string, purpose: TokenPurpose): Promise<void> {
  await sql`UPDATE auth_tokens SET used_at = now()
            WHERE account_id = ${accountId} AND purpose = ${purpose} AND used_at IS NULL`;
}
