import { randomBytes } from 'node:crypto';
import { newId } from '@svc/core';
import { accounts } from '@svc/db';
import type { Service } from '../../gateway/src/main.ts';
import { createApiKey } from '../../gateway/src/services/credentials.ts';

/**
 * A verified bench account with a full-scope API key, made directly in the database (the mail
 * round trip of sign-up is not what a bench measures). The password is unusable on purpose.
 */
export async function signUp(svc: Service): Promise<{ accountId: string; key: string }> {
  const id = newId('acc');
  await accounts.insertAccount(svc.db.sql, {
    id,
    email: `bench-${id}@bench.invalid`,
    passwordHash: `bench:${randomBytes(16).toString('hex')}`,
    role: 'user',
    dataKey: svc.keyring.newWrappedDataKey(id),
  });
  await accounts.markEmailVerified(svc.db.sql, id);
  const { key } = await createApiKey(svc.db.sql, { accountId: id, actor: 'api', ip: null }, { scope: 'full' });
  return { accountId: id, key };
}
