import { accounts, conversationSecrets, type Sql, transaction } from '@svc/db';
import type { HeldText, SecretStore } from '../log/log.append.ts';
import type { Keyring } from '../secrets/keyring.ts';

const purpose = (conversationId: string) => `redaction:${conversationId}`;
const heldPurpose = (conversationId: string) => `redaction-held:${conversationId}`;

/**
 * Where the write path finds a conversation's secret values when this node did not launch
 * the turn whose output it appends (the runner is held here, the launch was made elsewhere, or
 * by a process that has stopped since), and what a stopped process's redactors held back:
 * Postgres, sealed under the account's data key, like every other secret at rest.
 */
export function conversationSecretStore(deps: { sql: Sql; keyring: Keyring }): SecretStore {
  const open = (accountId: string, conversationId: string, row: { sealed: Uint8Array; data_key: Uint8Array }) =>
    JSON.parse(deps.keyring.decrypt(accountId, row.data_key, purpose(conversationId), row.sealed)) as string[];
  return {
    async load(accountId, conversationId) {
      const row = await conversationSecrets.sealedSecrets(deps.sql, accountId, conversationId);
      if (!row) return { values: [] };
      const values = open(accountId, conversationId, row);
      const held = row.has_held ? await conversationSecrets.takeHeld(deps.sql, accountId, conversationId) : undefined;
      if (!held) return { values };
      const text = deps.keyring.decrypt(accountId, row.data_key, heldPurpose(conversationId), held);
      return { values, held: JSON.parse(text) as HeldText };
    },

    async add(accountId, conversationId, values) {
      if (values.length === 0) return;
      // A conversation launches one turn at a time, so adds do not overlap; should two, the
      // row's lock keeps either from losing the other's values once the row exists.
      await transaction(deps.sql, async (tx) => {
        const row = await conversationSecrets.sealedSecrets(tx, accountId, conversationId, true);
        const all = new Set(row ? open(accountId, conversationId, row) : []);
        const before = all.size;
        for (const v of values) all.add(v);
        if (row && all.size === before) return;
        const dataKey = row?.data_key ?? (await accounts.findAccountById(tx, accountId))?.data_key;
        if (!dataKey) return; // the account is gone: nothing of it runs any more
        const sealed = deps.keyring.encrypt(accountId, dataKey, purpose(conversationId), JSON.stringify([...all]));
        await conversationSecrets.storeSealedSecrets(tx, accountId, conversationId, sealed);
      });
    },

    async saveHeld(accountId, conversationId, held) {
      const account = await accounts.findAccountById(deps.sql, accountId);
      if (!account) return;
      const sealed = deps.keyring.encrypt(
        accountId,
        account.data_key,
        heldPurpose(conversationId),
        JSON.stringify(held),
      );
      await conversationSecrets.storeHeld(deps.sql, accountId, conversationId, sealed);
    },
  };
}
