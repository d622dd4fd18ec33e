import type { Sql } from '../connect.ts';

export interface InferenceCredentialRow {
  provider: string;
  ciphertext: Uint8Array;
  updated_at: Date;
}

export async function upsertInferenceCredential(
  sql: Sql,
  accountId: string,
  provider: string,
  ciphertext: Uint8Array,
): Promise<void> {
  await sql`INSERT INTO inference_credentials (account_id, provider, ciphertext)
            VALUES (${accountId}, ${provider}, ${ciphertext})
            ON CONFLICT (account_id, provider) DO UPDATE SET ciphertext = excluded.ciphertext, updated_at = now()`;
}

export async function listInferenceCredentials(sql: Sql, accountId: string): Promise<InferenceCredentialRow[]> {
  return sql<InferenceCredentialRow[]>`
    SELECT provider, ciphertext, updated_at FROM inference_credentials WHERE account_id = ${accountId}`;
}

export async function deleteInferenceCredential(sql: Sql, accountId: string, provider: string): Promise<boolean> {
  const rows = await sql`DELETE FROM inference_credentials
                         WHERE account_id = ${accountId} AND provider = ${provider} RETURNING provider`;
  return rows.length === 1;
}
