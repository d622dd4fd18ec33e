import {
  ApiError,
  newId,
  orNotFound,
  SECRET_BINDING_PRESET_LIST,
  type SecretBinding,
  type SecretBindingCreate,
  type SecretBindingPatch,
  type SecretBindingPreset,
} from '@svc/core';
import { type Sql, secretBindings, transaction } from '@svc/db';
import type { z } from 'zod';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';

/*
 * Secret bindings: which secret, by name, the egress broker writes into which header of
 * requests to which host (DECISIONS "Sandboxes that hold"). A binding holds no value, so
 * nothing here is secret; audit rows name the binding's name, host and shape.
 */

type Binding = z.infer<typeof SecretBinding>;

/** The 404 every broker route answers while EGRESS_BROKER is off (SPEC Conventions 6: limited access). */
export function brokerDisabled(): ApiError {
  return new ApiError('not_found', 'The egress credential broker is not enabled on this instance.', {
    extra: { broker: 'disabled' },
  });
}

export function shapeBinding(row: secretBindings.BindingRow): Binding {
  return {
    id: row.id,
    secret_name: row.secret_name,
    host: row.host,
    shape: row.shape as Binding['shape'],
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}

const bindingExists = (secretName: string, host: string) =>
  new ApiError('binding_exists', `${secretName} is already bound to ${host}.`);

/** The presets a binding's shape may name, in listing order. */
export function listPresets(): z.infer<typeof SecretBindingPreset>[] {
  return SECRET_BINDING_PRESET_LIST.map((p) => ({ ...p, hosts: [...p.hosts] }));
}

export async function listBindings(sql: Sql, accountId: string): Promise<Binding[]> {
  return (await secretBindings.listBindings(sql, accountId)).map(shapeBinding);
}

export async function getBinding(sql: Sql, accountId: string, id: string): Promise<secretBindings.BindingRow> {
  return orNotFound(await secretBindings.getBinding(sql, accountId, id), 'Secret binding');
}

/** Creates a binding; 409 `binding_exists` when the account already binds that name to that host. */
export async function createBinding(
  sql: Sql,
  who: ActorRef,
  input: z.infer<typeof SecretBindingCreate>,
): Promise<Binding> {
  const id = newId('sbd');
  const row = await transaction(sql, async (tx) => {
    const created = await secretBindings.insertBinding(tx, {
      id,
      accountId: who.accountId,
      secretName: input.secret_name,
      host: input.host,
      shape: input.shape,
    });
    if (created === 'conflict') throw bindingExists(input.secret_name, input.host);
    await recordAudit(
      tx,
      who,
      'secret_binding.created',
      { type: 'secret_binding', id },
      { secret_name: input.secret_name, host: input.host, shape: input.shape },
    );
    return created;
  });
  return shapeBinding(row);
}

/** Writes the fields given; 404 for another account's binding, 409 as for create. */
export async function updateBinding(
  sql: Sql,
  who: ActorRef,
  id: string,
  patch: z.infer<typeof SecretBindingPatch>,
): Promise<Binding> {
  const before = await getBinding(sql, who.accountId, id);
  const row = await transaction(sql, async (tx) => {
    const updated = orNotFound(
      await secretBindings.updateBinding(tx, who.accountId, id, {
        secretName: patch.secret_name,
        host: patch.host,
        shape: patch.shape,
      }),
      'Secret binding',
    );
    if (updated === 'conflict') {
      throw bindingExists(patch.secret_name ?? before.secret_name, patch.host ?? before.host);
    }
    await recordAudit(
      tx,
      who,
      'secret_binding.updated',
      { type: 'secret_binding', id },
      { fields: Object.keys(patch).sort(), secret_name: updated.secret_name, host: updated.host, shape: updated.shape },
    );
    return updated;
  });
  return shapeBinding(row);
}

export async function deleteBinding(sql: Sql, who: ActorRef, id: string): Promise<void> {
  await transaction(sql, async (tx) => {
    orNotFound(await secretBindings.deleteBinding(tx, who.accountId, id), 'Secret binding');
    await recordAudit(tx, who, 'secret_binding.deleted', { type: 'secret_binding', id });
  });
}
