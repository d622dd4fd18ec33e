import type { Sql } from '../connect.ts';

export interface OAuthCodeRow {
  account_id: string;
  client_id: string;
  redirect_uri: string;
  code_challenge: string;
}

export async function insertOAuthCode(
  sql: Sql,
  c: {
    codeHash: Uint8Array;
    accountId: string;
    clientId: string;
    redirectUri: string;
    codeChallenge: string;
    expiresAt: Date;
  },
): Promise<void> {
  await sql`INSERT INTO oauth_codes (code_hash, account_id, client_id, redirect_uri, code_challenge, expires_at)
            VALUES (${c.codeHash}, ${c.accountId}, ${c.clientId}, ${c.redirectUri}, ${c.codeChallenge}, ${c.expiresAt})`;
}

/** Uses the code once: answers it only if unused and unexpired, and marks it used in the same statement. */
export async function consumeOAuthCode(sql: Sql, codeHash: Uint8Array): Promise<OAuthCodeRow | undefined> {
  const rows = await sql<OAuthCodeRow[]>`
    UPDATE oauth_codes SET used_at = now()
    WHERE code_hash = ${codeHash} AND used_at IS NULL AND expires_at > now()
    RETURNING account_id, client_id, redirect_uri, code_challenge`;
  return rows[0];
}
