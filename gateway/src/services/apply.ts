import {
  AgentCreate,
  ApiError,
  type ApplyKind,
  type ApplyResult,
  EnvironmentCreate,
  EnvKey,
  VaultFields,
} from '@svc/core';
import { agents as agentRows, environments, type Sql, vaults as vaultRows } from '@svc/db';
import { z } from 'zod';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import type { Keyring } from '../secrets/keyring.ts';
import { createAgent, updateAgent } from './agents.ts';
import { createEnvironment, updateEnvironment } from './environments.ts';
import type { ActorRef } from './principal.ts';
import type { RetireSandboxesBuiltOn } from './sandboxes.ts';
import { type SecretWrite, writeSecrets } from './secrets.ts';
import { createVault } from './vaults.ts';

type Kind = z.infer<typeof ApplyKind>;
type Result = z.infer<typeof ApplyResult>;
type Resource = { kind: Kind; name: string; spec: Record<string, unknown> };

export interface ApplyDeps {
  sql: Sql;
  keyring: Keyring;
  retire: RetireSandboxesBuiltOn;
  providers: SandboxProviders;
}

const ORDER: Kind[] = ['Environment', 'Vault', 'Agent'];

/** A field-level failure of one resource; its `details` become the result's `errors`. */
class ResourceError extends Error {
  constructor(readonly details: Record<string, string[]>) {
    super('resource failed');
  }
}

function zodDetails(error: z.ZodError, prefix = ''): Record<string, string[]> {
  const details: Record<string, string[]> = {};
  for (const issue of error.issues) {
    const path = [prefix, ...issue.path.map(String)].filter(Boolean).join('.') || '(spec)';
    const message =
      issue.code === 'unrecognized_keys'
        ? `unknown field${issue.keys.length > 1 ? 's' : ''} ${issue.keys.join(', ')}`
        : issue.message;
    details[path] = [...(details[path] ?? []), message];
  }
  return details;
}

function parse<T extends z.ZodType>(schema: T, value: unknown): z.infer<T> {
  const r = schema.safeParse(value);
  if (!r.success) throw new ResourceError(zodDetails(r.error));
  return r.data;
}

const SecretValue = z.union([
  z.string().min(1).max(65_536),
  z
    .object({
      value: z.string().min(1).max(65_536),
      expires_at: z.iso.datetime({ offset: true }).nullable().optional(),
    })
    .strict(),
]);

/** Splits `secrets` into valid writes and per-key errors; an invalid key never aborts the resource. */
function secretWrites(raw: unknown, allowExpiry: boolean) {
  const writes: SecretWrite[] = [];
  const outcomes: NonNullable<Result['secrets']> = {};
  if (raw === undefined) return { writes, outcomes };
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    throw new ResourceError({ secrets: ['must be a map of key to value'] });
  }
  for (const [key, value] of Object.entries(raw)) {
    if (!EnvKey.safeParse(key).success) {
      outcomes[key] = { outcome: 'error', error: 'must be a valid environment variable name' };
      continue;
    }
    const v = SecretValue.safeParse(value);
    if (!v.success || (typeof v.data === 'object' && v.data.expires_at && !allowExpiry)) {
      outcomes[key] = {
        outcome: 'error',
        error: v.success
          ? 'expires_at is for vault secrets'
          : 'must be a non-empty string (or {value, expires_at} in a vault)',
      };
      continue;
    }
    const write =
      typeof v.data === 'string'
        ? { key, value: v.data }
        : { key, value: v.data.value, expiresAt: v.data.expires_at ? new Date(v.data.expires_at) : null };
    writes.push(write);
  }
  return { writes, outcomes };
}

/**
 * `POST /api/apply`: upserts environments, then vaults, then agents, by name, each in its own
 * transaction and best-effort (one failing resource does not stop the others). An existing
 * resource is replaced by its spec (fields it omits return to their defaults); secrets are
 * upserted key by key and a value equal to the stored one is `unchanged`, so applying the same
 * manifest twice changes nothing. Results come back in manifest order; values never appear.
 */
export async function applyManifest(deps: ApplyDeps, who: ActorRef, resources: Resource[]): Promise<Result[]> {
  const results: Result[] = new Array(resources.length);
  const seen = new Set<string>();
  const environmentIds = new Map<string, string>(); // names applied in this manifest

  for (const kind of ORDER) {
    for (const [index, resource] of resources.entries()) {
      if (resource.kind !== kind) continue;
      const base = { kind, name: resource.name };
      const dupKey = `${kind}:${resource.name}`;
      if (seen.has(dupKey)) {
        results[index] = { ...base, action: 'error', id: null, errors: { name: ['appears twice in this manifest'] } };
        continue;
      }
      seen.add(dupKey);
      try {
        results[index] = await deps.sql.begin(async (tx) => {
          const sql = tx as unknown as Sql;
          if (kind === 'Environment') {
            const r = await applyEnvironment({ ...deps, sql }, who, resource);
            if (r.id) environmentIds.set(resource.name, r.id);
            return r;
          }
          if (kind === 'Vault') return applyVault({ ...deps, sql }, who, resource);
          return applyAgent({ ...deps, sql }, who, resource, environmentIds);
        });
      } catch (err) {
        results[index] = { ...base, action: 'error', id: null, errors: errorDetails(err) };
      }
    }
  }
  return results;
}

function errorDetails(err: unknown): Record<string, string[]> {
  if (err instanceof ResourceError) return err.details;
  if (err instanceof ApiError) {
    const details = err.extra?.details as Record<string, string[]> | undefined;
    return details ?? { '(resource)': [err.message] };
  }
  throw err;
}

async function applyEnvironment(deps: ApplyDeps, who: ActorRef, r: Resource): Promise<Result> {
  const { secrets, ...fields } = r.spec;
  const input = parse(EnvironmentCreate, { ...fields, name: r.name });
  const { writes, outcomes } = secretWrites(secrets, false);
  const existing = await environments.findEnvironmentByName(deps.sql, who.accountId, r.name);
  const row = existing
    ? await updateEnvironment(deps.sql, who, existing.id, input, true)
    : await createEnvironment(deps.sql, who, input);
  for (const w of await writeSecrets(deps, who, 'environment', row.id, writes, true))
    outcomes[w.key] = { outcome: w.outcome };
  return withSecrets(
    { kind: 'Environment', name: r.name, action: existing ? 'updated' : 'created', id: row.id },
    outcomes,
  );
}

async function applyVault(deps: ApplyDeps, who: ActorRef, r: Resource): Promise<Result> {
  const { secrets, ...fields } = r.spec;
  parse(VaultFields, { ...fields, name: r.name });
  const { writes, outcomes } = secretWrites(secrets, true);
  const existing = await vaultRows.findVaultByName(deps.sql, who.accountId, r.name);
  const row = existing ?? (await createVault(deps.sql, who, r.name));
  for (const w of await writeSecrets(deps, who, 'vault', row.id, writes, true))
    outcomes[w.key] = { outcome: w.outcome };
  return withSecrets({ kind: 'Vault', name: r.name, action: existing ? 'updated' : 'created', id: row.id }, outcomes);
}

async function applyAgent(deps: ApplyDeps, who: ActorRef, r: Resource, applied: Map<string, string>): Promise<Result> {
  const { environment, ...fields } = r.spec;
  let environmentId = fields.environment_id;
  if (environment !== undefined) {
    if (typeof environment !== 'string')
      throw new ResourceError({ environment: ['must be the name of an environment'] });
    environmentId =
      applied.get(environment) ?? (await environments.findEnvironmentByName(deps.sql, who.accountId, environment))?.id;
    if (!environmentId) {
      throw new ResourceError({
        environment: [`no environment named ${environment} in this manifest or this account`],
      });
    }
  }
  const input = parse(AgentCreate, { ...fields, name: r.name, environment_id: environmentId });
  const existing = await agentRows.findAgentByName(deps.sql, who.accountId, r.name);
  const row = existing
    ? await updateAgent(deps.sql, who, existing.id, input, deps, true)
    : await createAgent(deps.sql, who, input, deps.providers);
  return { kind: 'Agent', name: r.name, action: existing ? 'updated' : 'created', id: row.id };
}

function withSecrets(result: Result, outcomes: NonNullable<Result['secrets']>): Result {
  return Object.keys(outcomes).length ? { ...result, secrets: outcomes } : result;
}
