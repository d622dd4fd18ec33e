import type { Sql } from '../connect.ts';

/** A credential row as the auth layer needs it: the key, and the account state it depends on. */
export interface CredentialRow {
  id: string;
  account_id: string;
  kind: 'api' | 'oauth' | 'sandbox';
  name: string;
  prefix: string;
  scope: 'full' | 'standard' | 'conversation';
  conversation_id: string | null;
  client_id: string | null;
  session_version: number | null;
  created_at: Date;
  expires_at: Date | null;
  last_used_at: Date | null;
  revoked_at: Date | null;
}

export interface CredentialWithAccount extends CredentialRow {
  account_role: 'user' | 'admin';
  account_suspended: boolean;
}

export async function insertCredential(
  sql: Sql,
  c: {
    id: string;
    accountId: string;
    kind: CredentialRow['kind'];
    name: string;
    prefix: string;
    tokenHash: Uint8Array;
    scope: CredentialRow['scope'];
    conversationId?: string | null;
    clientId?: string | null;
    sessionVersion?: number | null;
    expiresAt?: Date | null;
  },
): Promise<CredentialRow> {
  const rows = await sql<CredentialRow[]>`
    INSERT INTO api_keys (id, account_id, kind, name, prefix, token_hash, scope, conversation_id,
                          client_id, session_version, expires_at)
    VALUES (${c.id}, ${c.accountId}, ${c.kind}, ${c.name}, ${c.prefix}, ${c.tokenHash}, ${c.scope},
            ${c.conversationId ?? null}, ${c.clientId ?? null}, ${c.sessionVersion ?? null}, ${c.expiresAt ?? null})
    RETURNING *`;
  return rows[0] as CredentialRow;
}

/**
 * The live credential with this hash: not revoked, not expired, and, for keys bound to a
 * session version (OAuth-issued), not signed out by a password reset or email change.
 */
export async function findLiveCredential(sql: Sql, tokenHash: Uint8Array): Promise<CredentialWithAccount | undefined> {
  const rows = await sql<CredentialWithAccount[]>`
    SELECT k.*, a.role AS account_role, a.suspended AS account_suspended
    FROM api_keys k JOIN accounts a ON a.id = k.account_id
    WHERE k.token_hash = ${tokenHash} AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > now())
      AND (k.session_version IS NULL OR k.session_version = a.session_version)`;
  return rows[0];
}

/**
 * Stamps `last_used_at` at most once a minute per key, so a busy key does not write on every
 * request.
 */
export async function touchCredential(sql: Sql, id: string): Promise<void> {
  await sql`UPDATE api_keys SET last_used_at = now()
            WHERE id = ${id} AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`;
}

/** API and OAuth keys of the account that still work, newest first. Sandbox tokens are not listed. */
export async function listKeys(sql: Sql, accountId: string): Promise<CredentialRow[]> {
  return sql<CredentialRow[]>`
    SELECT k.* FROM api_keys k JOIN accounts a ON a.id = k.account_id
    WHERE k.account_id = ${accountId} AND k.kind IN ('api', 'oauth') AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > now())
      AND (k.session_version IS NULL OR k.session_version = a.session_version)
    ORDER BY k.created_at DESC, k.id DESC`;
}

/** Revokes one API or OAuth key of the account; false when there is no such live key. */
/**
 * Revokes an API key of the account: `missing` when it has no such live key, `forbidden` (and
 * nothing changes) when the key is full-scope and `allowFull` is false.
 */
export async function revokeKey(
  sql: Sql,
  accountId: string,
  id: string,
  opts: { allowFull: boolean } = { allowFull: true },
): Promise<'revoked' | 'missing' | 'forbidden'> {
  const rows = await sql<{ id: string; scope: CredentialRow['scope']; revoked: boolean }[]>`
    WITH target AS (
      SELECT id, scope FROM api_keys
      WHERE account_id = ${accountId} AND id = ${id} AND kind IN ('api', 'oauth') AND revoked_at IS NULL
    ), done AS (
      UPDATE api_keys SET revoked_at = now()
      WHERE id IN (SELECT id FROM target WHERE ${opts.allowFull} OR scope <> 'full')
      RETURNING id
    )
    SELECT target.id, target.scope, EXISTS (SELECT 1 FROM done) AS revoked FROM target`;
  const row = rows[0];
  if (!row) return 'missing';
  return row.revoked ? 'revoked' : 'forbidden';
}

export async function revokeCredentialByHash(sql: Sql, tokenHash: Uint8Array): Promise<CredentialRow | undefined> {
  const rows = await sql<CredentialRow[]>`
    UPDATE api_keys SET revoked_at = now() WHERE token_hash = ${tokenHash} AND revoked_at IS NULL RETURNING *`;
  return rows[0];
}

/** Revokes every sandbox token of a conversation (it ended). */
export async function revokeSandboxTokens(sql: Sql, accountId: string, conversationId: string): Promise<number> {
  const rows = await sql`
    UPDATE api_keys SET revoked_at = now()
    WHERE account_id = ${accountId} AND conversation_id = ${conversationId} AND kind = 'sandbox' AND revoked_at IS NULL
    RETURNING id`;
  return rows.length;
}
