import type { Sql } from '../connect.ts';

/**
 * The sealed secret values of a conversation (migration 027), with the account's wrapped data
 * key that opens them; undefined when none were stored (or the conversation is another
 * tenant's, or gone).
 */
export async function sealedSecrets(
  sql: Sql,
  accountId: string,
  conversationId: string,
  lock = false,
): Promise<{ sealed: Uint8Array; data_key: Uint8Array } | undefined> {
  const rows = await sql<{ sealed: Uint8Array; data_key: Uint8Array }[]>`
    SELECT s.sealed, a.data_key FROM conversation_secrets s JOIN accounts a ON a.id = s.account_id
    WHERE s.account_id = ${accountId} AND s.conversation_id = ${conversationId}
    ${lock ? sql`FOR UPDATE OF s` : sql``}`;
  return rows[0];
}

/**
 * Stores the conversation's sealed values, replacing what was there. Nothing is stored for a
 * conversation that is not the account's (or no longer exists). Returns whether it was stored.
 */
export async function storeSealedSecrets(
  sql: Sql,
  accountId: string,
  conversationId: string,
  sealed: Uint8Array,
): Promise<boolean> {
  const rows = await sql`
    INSERT INTO conversation_secrets (conversation_id, account_id, sealed)
    SELECT id, account_id, ${sealed} FROM conversations WHERE id = ${conversationId} AND account_id = ${accountId}
    ON CONFLICT (conversation_id) DO UPDATE SET sealed = excluded.sealed, updated_at = now()
    RETURNING 1`;
  return rows.length > 0;
}
