import {
  ApiError,
  type EnvironmentCreate,
  type EnvironmentPatch,
  newId,
  orNotFound,
  validationFailed,
} from '@svc/core';
import { environments, type Sql } from '@svc/db';
import type { z } from 'zod';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';
import type { RetireSandboxesBuiltOn } from './sandboxes.ts';

type Create = z.infer<typeof EnvironmentCreate>;
type Patch = z.infer<typeof EnvironmentPatch>;

export function shapeEnvironment(row: environments.EnvironmentRow) {
  return {
    id: row.id,
    name: row.name,
    packages: row.packages,
    env_vars: row.env_vars,
    repositories: row.repositories,
    setup_script: row.setup_script,
    networking_type: row.networking_type,
    networking_config: row.networking_config,
    secret_count: row.secret_count,
    agent_count: row.agent_count,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}

/** The stored values of a new (or wholly replaced) environment: given fields over defaults. */
export function environmentValues(input: Create): environments.EnvironmentValues {
  return {
    name: input.name,
    packages: input.packages ?? {},
    env_vars: input.env_vars ?? {},
    repositories: input.repositories ?? [],
    setup_script: input.setup_script ?? '',
    networking_type: input.networking_type ?? (input.networking_config ? 'limited' : 'unrestricted'),
    networking_config: input.networking_config ?? null,
  };
}

const nameTaken = () => validationFailed({ name: ['is already used by another environment of this account'] });

export async function getEnvironment(sql: Sql, accountId: string, id: string) {
  return orNotFound(await environments.getEnvironment(sql, accountId, id), 'Environment');
}

export async function createEnvironment(sql: Sql, who: ActorRef, input: Create) {
  const row = await environments.insertEnvironment(sql, who.accountId, newId('env'), environmentValues(input));
  if (!row) throw nameTaken();
  await recordAudit(
    sql,
    who,
    'environment.created',
    { type: 'environment', id: row.id },
    { fields: Object.keys(input) },
  );
  return row;
}

/** Writes the given values over the stored ones (PUT and PATCH both update the fields present). */
export async function updateEnvironment(sql: Sql, who: ActorRef, id: string, patch: Patch, replace = false) {
  const current = await getEnvironment(sql, who.accountId, id);
  const values = replace
    ? environmentValues({ ...patch, name: patch.name ?? current.name })
    : { ...storedValues(current), ...definedOnly(patch) };
  if (!replace && patch.networking_config !== undefined && patch.networking_type === undefined) {
    values.networking_type = patch.networking_config ? 'limited' : 'unrestricted';
  }
  const row = orNotFound(await environments.updateEnvironment(sql, who.accountId, id, values), 'Environment');
  if (row === 'conflict') throw nameTaken();
  await recordAudit(sql, who, 'environment.updated', { type: 'environment', id }, { fields: Object.keys(patch) });
  return row;
}

/** Refused (409) while agents use it; otherwise retires sandboxes built on it, then deletes. */
export async function deleteEnvironment(sql: Sql, who: ActorRef, id: string, retire: RetireSandboxesBuiltOn) {
  const current = await getEnvironment(sql, who.accountId, id);
  if (current.agent_count > 0) {
    throw new ApiError('environment_in_use', undefined, { extra: { agent_count: current.agent_count } });
  }
  await retire({ accountId: who.accountId, environmentId: id, reason: 'environment_deleted' });
  const deleted = orNotFound(await environments.deleteEnvironment(sql, who.accountId, id), 'Environment');
  if (deleted === 'in_use') throw new ApiError('environment_in_use');
  await recordAudit(sql, who, 'environment.deleted', { type: 'environment', id }, { name: current.name });
}

function storedValues(row: environments.EnvironmentRow): environments.EnvironmentValues {
  const { id: _id, secret_count: _s, agent_count: _a, created_at: _c, updated_at: _u, ...values } = row;
  return values;
}

/** The object without its undefined entries, so a partial update keeps what it does not name. */
export function definedOnly<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
