import { newId, orNotFound, validationFailed } from '@svc/core';
import { type Sql, vaults } from '@svc/db';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';
import type { RetireSandboxesBuiltOn } from './sandboxes.ts';

export function shapeVault(row: vaults.VaultRow) {
  return {
    id: row.id,
    name: row.name,
    secret_count: row.secret_count,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}

const nameTaken = () => validationFailed({ name: ['is already used by another vault of this account'] });

export async function getVault(sql: Sql, accountId: string, id: string) {
  return orNotFound(await vaults.getVault(sql, accountId, id), 'Vault');
}

export async function createVault(sql: Sql, who: ActorRef, name: string) {
  const row = await vaults.insertVault(sql, who.accountId, newId('vlt'), name);
  if (!row) throw nameTaken();
  await recordAudit(sql, who, 'vault.created', { type: 'vault', id: row.id });
  return row;
}

export async function renameVault(sql: Sql, who: ActorRef, id: string, name: string) {
  const row = orNotFound(await vaults.renameVault(sql, who.accountId, id, name), 'Vault');
  if (row === 'conflict') throw nameTaken();
  await recordAudit(sql, who, 'vault.updated', { type: 'vault', id }, { fields: ['name'] });
  return row;
}

/** Retires sandboxes built with the vault, then deletes it with its secrets. */
export async function deleteVault(sql: Sql, who: ActorRef, id: string, retire: RetireSandboxesBuiltOn) {
  const current = await getVault(sql, who.accountId, id);
  await retire({ accountId: who.accountId, vaultId: id, reason: 'vault_deleted' });
  orNotFound(await vaults.deleteVault(sql, who.accountId, id), 'Vault');
  await recordAudit(sql, who, 'vault.deleted', { type: 'vault', id }, { name: current.name });
}
