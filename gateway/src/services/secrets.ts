import { ApiError, newId } from '@svc/core';
import { accounts, type Sql, secrets } from '@svc/db';
import type { Keyring } from '../secrets/keyring.ts';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';

export type SecretOwner = secrets.SecretOwner;

/** The associated-data label binding a ciphertext to its owner and key (see Keyring). */
const purpose = (owner: SecretOwner, ownerId: string, key: string) => `${owner}-secret:${ownerId}:${key}`;

export function shapeSecret(owner: SecretOwner, row: secrets.SecretRow) {
  const base = {
    id: row.id,
    key: row.key,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
  if (owner === 'environment') return base;
  return {
    ...base,
    expires_at: row.expires_at?.toISOString() ?? null,
    expired: row.expires_at !== null && row.expires_at.getTime() <= Date.now(),
  };
}

export async function listSecrets(sql: Sql, owner: SecretOwner, accountId: string, ownerId: string) {
  return (await secrets.listSecrets(sql, owner, accountId, ownerId)).map((r) => shapeSecret(owner, r));
}

async function dataKey(sql: Sql, accountId: string): Promise<Uint8Array> {
  const account = await accounts.findAccountById(sql, accountId);
  if (!account) throw new ApiError('unauthorized');
  return account.data_key;
}

export interface SecretWrite {
  key: string;
  value: string;
  expiresAt?: Date | null;
}

/**
 * Upserts secrets of one owner, encrypted under the account's data key. With `compare`, a
 * value equal to the stored one is left alone and reported `unchanged` (bulk apply). Audit
 * rows carry the key, never the value.
 */
export async function writeSecrets(
  deps: { sql: Sql; keyring: Keyring },
  who: ActorRef,
  owner: SecretOwner,
  ownerId: string,
  writes: SecretWrite[],
  compare = false,
): Promise<{ key: string; outcome: 'created' | 'updated' | 'unchanged'; row?: secrets.SecretRow }[]> {
  const { sql, keyring } = deps;
  const wrapped = await dataKey(sql, who.accountId);
  const existing = compare
    ? new Map((await secrets.listSecrets(sql, owner, who.accountId, ownerId)).map((r) => [r.key, r]))
    : new Map();
  const out: { key: string; outcome: 'created' | 'updated' | 'unchanged'; row?: secrets.SecretRow }[] = [];
  for (const w of writes) {
    const before = existing.get(w.key);
    if (before) {
      const same =
        keyring.decrypt(who.accountId, wrapped, purpose(owner, ownerId, w.key), before.ciphertext) === w.value &&
        (owner === 'environment' || (before.expires_at?.getTime() ?? null) === (w.expiresAt?.getTime() ?? null));
      if (same) {
        out.push({ key: w.key, outcome: 'unchanged' });
        continue;
      }
    }
    const row = await secrets.upsertSecret(sql, owner, {
      id: newId('sec'),
      accountId: who.accountId,
      ownerId,
      key: w.key,
      ciphertext: keyring.encrypt(who.accountId, wrapped, purpose(owner, ownerId, w.key), w.value),
      expiresAt: w.expiresAt ?? null,
    });
    await recordAudit(sql, who, `${owner}.secret.upserted`, { type: owner, id: ownerId }, { key: w.key });
    out.push({ key: w.key, outcome: row.created ? 'created' : 'updated', row });
  }
  return out;
}

export async function deleteSecret(sql: Sql, who: ActorRef, owner: SecretOwner, ownerId: string, key: string) {
  const id = await secrets.deleteSecret(sql, owner, who.accountId, ownerId, key);
  if (!id) throw new ApiError('not_found', `No secret ${key}.`);
  await recordAudit(sql, who, `${owner}.secret.deleted`, { type: owner, id: ownerId }, { key });
}

/**
 * The plaintext values of an owner's live secrets, for the sandbox environment only (the
 * runner issue places them); expired vault secrets are left out.
 */
export async function revealSecrets(
  deps: { sql: Sql; keyring: Keyring },
  owner: SecretOwner,
  accountId: string,
  ownerId: string,
): Promise<Record<string, string>> {
  const wrapped = await dataKey(deps.sql, accountId);
  const now = Date.now();
  const out: Record<string, string> = {};
  for (const r of await secrets.listSecrets(deps.sql, owner, accountId, ownerId)) {
    if (r.expires_at && r.expires_at.getTime() <= now) continue;
    out[r.key] = deps.keyring.decrypt(accountId, wrapped, purpose(owner, ownerId, r.key), r.ciphertext);
  }
  return out;
}
