import type { Sql } from '../connect.ts';

export interface SessionWithAccount {
  id: string;
  account_id: string;
  session_version: number;
  expires_at: Date;
  account_role: 'user' | 'admin';
  account_suspended: boolean;
}

export async function insertSession(
  sql: Sql,
  s: { id: string; accountId: string; tokenHash: Uint8Array; sessionVersion: number; expiresAt: Date },
): Promise<void> {
  await sql`INSERT INTO sessions (id, account_id, token_hash, session_version, expires_at)
            VALUES (${s.id}, ${s.accountId}, ${s.tokenHash}, ${s.sessionVersion}, ${s.expiresAt})`;
}

/** The session with this hash while it has not expired and its account's session_version still matches. */
export async function findLiveSession(sql: Sql, tokenHash: Uint8Array): Promise<SessionWithAccount | undefined> {
  const rows = await sql<SessionWithAccount[]>`
    SELECT s.id, s.account_id, s.session_version, s.expires_at, a.role AS account_role, a.suspended AS account_suspended
    FROM sessions s JOIN accounts a ON a.id = s.account_id
    WHERE s.token_hash = ${tokenHash} AND s.expires_at > now() AND s.session_version = a.session_version`;
  return rows[0];
}

/** Deletes the session with this hash; answers which one it was, if any. */
export async function deleteSession(
  sql: Sql,
  tokenHash: Uint8Array,
): Promise<{ id: string; account_id: string } | undefined> {
  const rows = await sql<{ id: string; account_id: string }[]>`
    DELETE FROM sessions WHERE token_hash = ${tokenHash} RETURNING id, account_id`;
  return rows[0];
}

/** Signs out every browser session of the account; returns how many were live. */
export async function deleteSessionsOfAccount(sql: Sql, accountId: string): Promise<number> {
  const rows = await sql<{ live: boolean }[]>`
    DELETE FROM sessions s USING accounts a
    WHERE s.account_id = ${accountId} AND a.id = s.account_id
    RETURNING (s.expires_at > now() AND s.session_version = a.session_version) AS live`;
  return rows.filter((r) => r.live).length;
}
