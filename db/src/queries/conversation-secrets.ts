import type { Sql } from '../connect.ts';

/**
 * The sealed secret values of a conversation (migration 027), with the account's wrapped data
 * key that opens them, and whether held-back text waits to be taken; undefined when none were
 * stored (or the conversation is another tenant's, or gone).
 */
export async function sealedSecrets(
  sql: Sql,
  accountId: string,
  conversationId: string,
  lock = false,
): Promise<{ sealed: Uint8Array; data_key: Uint8Array; has_held: boolean } | undefined> {
  const rows = await sql<{ sealed: Uint8Array; data_key: Uint8Array; has_held: boolean }[]>`
    SELECT s.sealed, a.data_key, s.held IS NOT NULL AS has_held
    FROM conversation_secrets s JOIN accounts a ON a.id = s.account_id
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

/** Stores what the conversation's redactors hold back (sealed), in place of anything stored. */
export async function storeHeld(sql: Sql, accountId: string, conversationId: string, held: Uint8Array) {
  await sql`
    UPDATE conversation_secrets SET held = ${held}
    WHERE account_id = ${accountId} AND conversation_id = ${conversationId}`;
}

/**
 * Takes the held-back text stored for the conversation: returns it and clears it, under the
 * row's lock, so of two callers at once only one gets it.
 */
export async function takeHeld(sql: Sql, accountId: string, conversationId: string): Promise<Uint8Array | undefined> {
  const rows = await sql<{ held: Uint8Array }[]>`
    WITH old AS (
      SELECT held FROM conversation_secrets
      WHERE account_id = ${accountId} AND conversation_id = ${conversationId} AND held IS NOT NULL
      FOR UPDATE
    )
    UPDATE conversation_secrets s SET held = NULL FROM old
    WHERE s.account_id = ${accountId} AND s.conversation_id = ${conversationId}
    RETURNING old.held`;
  return rows[0]?.held;
}
