import {
  type AgentCreate,
  type AgentPatch,
  ApiError,
  AVATAR_MAX_BYTES,
  AVATAR_TYPES,
  modelProblem,
  newId,
  orNotFound,
  type Runtime,
  sniffImage,
  tooLarge,
  validationFailed,
} from '@svc/core';
import { agents, type Sql, teammates, vaults } from '@svc/db';
import type { z } from 'zod';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import { recordAudit } from './audit.ts';
import { definedOnly } from './environments.ts';
import type { ActorRef } from './principal.ts';
import type { RetireSandboxesBuiltOn } from './sandboxes.ts';
import { removeTeammate, type TeamDeps } from './team.ts';

type Create = z.infer<typeof AgentCreate>;
type Patch = z.infer<typeof AgentPatch>;

/** The stored values of a new agent: given fields over defaults. */
export function agentValues(input: Create): agents.AgentValues {
  return {
    name: input.name,
    description: input.description ?? '',
    system: input.system ?? '',
    runtime: input.runtime,
    model: input.model,
    environment_id: input.environment_id,
    skills: input.skills ?? [],
    mcp_servers: input.mcp_servers ?? {},
    sandbox_provider: input.sandbox_provider ?? null,
    sandbox_mode: input.sandbox_mode ?? 'ephemeral',
    allowed_vault_ids: input.allowed_vault_ids === undefined ? null : dedupe(input.allowed_vault_ids),
    allowed_environment_ids: input.allowed_environment_ids === undefined ? null : dedupe(input.allowed_environment_ids),
    permission_policy: input.permission_policy ?? { default: 'auto_allow', ask: [] },
  };
}

function dedupe(ids: string[] | null): string[] | null {
  return ids === null ? null : [...new Set(ids)];
}

/**
 * Rules across fields and rows: the model's provider belongs to the runtime (422), the sandbox
 * provider is one this instance offers (422), the agent's environment is one its allowlist
 * permits (422), and every referenced environment and vault is the caller's (404 otherwise, so
 * ids cannot be probed).
 */
async function checkReferences(
  sql: Sql,
  providers: SandboxProviders,
  accountId: string,
  v: agents.AgentValues,
): Promise<void> {
  const problem = modelProblem(v.runtime as Runtime, v.model);
  if (problem) throw validationFailed({ model: [problem] });
  providers.forAgent(v.sandbox_provider);
  const envIds = [v.environment_id, ...(v.allowed_environment_ids ?? [])];
  const foundEnvs = await agents.existingEnvironmentIds(sql, accountId, envIds);
  if (!foundEnvs.has(v.environment_id)) throw new ApiError('not_found', `Environment ${v.environment_id} not found.`);
  const missingEnv = (v.allowed_environment_ids ?? []).find((id) => !foundEnvs.has(id));
  if (missingEnv) throw new ApiError('not_found', `Environment ${missingEnv} not found.`);
  const vaultIds = v.allowed_vault_ids ?? [];
  const foundVaults = await vaults.existingVaultIds(sql, accountId, vaultIds);
  const missingVault = vaultIds.find((id) => !foundVaults.has(id));
  if (missingVault) throw new ApiError('not_found', `Vault ${missingVault} not found.`);
  // An allowlist names the environments the agent may run under; a non-empty one that leaves
  // out the agent's own environment would forbid its default launch. ([] means no other one.)
  const allowed = v.allowed_environment_ids;
  if (allowed && allowed.length > 0 && !allowed.includes(v.environment_id)) {
    throw validationFailed({ environment_id: ['is not among allowed_environment_ids'] });
  }
}

const nameTaken = () => validationFailed({ name: ['is already used by another agent of this account'] });

export async function getAgent(sql: Sql, accountId: string, id: string) {
  return orNotFound(await agents.getAgent(sql, accountId, id), 'Agent');
}

export async function createAgent(sql: Sql, who: ActorRef, input: Create, providers: SandboxProviders) {
  const values = agentValues(input);
  await checkReferences(sql, providers, who.accountId, values);
  const row = await agents.insertAgent(sql, who.accountId, newId('agt'), values);
  if (!row) throw nameTaken();
  await recordAudit(
    sql,
    who,
    'agent.created',
    { type: 'agent', id: row.id },
    { runtime: row.runtime, model: row.model },
  );
  return row;
}

/**
 * Writes the given fields over the stored agent (PUT and PATCH both update the fields present;
 * `replace` resets the others to their defaults, as bulk apply does). A new environment_id
 * retires the sandboxes built for the agent on its old environment.
 */
export async function updateAgent(
  sql: Sql,
  who: ActorRef,
  id: string,
  patch: Patch,
  deps: { retire: RetireSandboxesBuiltOn; providers: SandboxProviders },
  replace = false,
) {
  const { retire } = deps;
  const current = await getAgent(sql, who.accountId, id);
  const values: agents.AgentValues = replace
    ? agentValues({
        ...patch,
        name: patch.name ?? current.name,
        runtime: patch.runtime ?? (current.runtime as Runtime),
        model: patch.model ?? current.model,
        environment_id: patch.environment_id ?? current.environment_id,
      })
    : { ...currentValues(current), ...definedOnly(patch) };
  await checkReferences(sql, deps.providers, who.accountId, values);
  const row = orNotFound(await agents.updateAgent(sql, who.accountId, id, values), 'Agent');
  if (row === 'conflict') throw nameTaken();
  if (values.environment_id !== current.environment_id) {
    await retire({
      accountId: who.accountId,
      agentId: id,
      environmentId: current.environment_id,
      reason: 'agent_environment_changed',
    });
  }
  await recordAudit(sql, who, 'agent.updated', { type: 'agent', id }, { fields: Object.keys(patch) });
  return row;
}

function currentValues(row: agents.AgentRow): agents.AgentValues {
  const { id: _id, avatar_media_type: _a, conversation_count: _c, created_at: _cr, updated_at: _u, ...values } = row;
  return values;
}

/**
 * `DELETE /api/agents/:id`. An agent on the team leaves it first, as `DELETE
 * /api/team/:agent_id` does (its live conversation ends, its team history leaves the channel,
 * with the `team` event); its conversations stay listed and readable.
 */
export async function deleteAgent(deps: Pick<TeamDeps, 'launch'>, who: ActorRef, id: string) {
  const { sql } = deps.launch;
  const current = await getAgent(sql, who.accountId, id);
  if (await teammates.getTeammate(sql, who.accountId, id)) {
    await removeTeammate(deps, who, id).catch((err: unknown) => {
      // Taken off the team meanwhile by another request: nothing left to do.
      if (!(err instanceof ApiError && err.code === 'not_found')) throw err;
    });
  }
  orNotFound(await agents.deleteAgent(sql, who.accountId, id), 'Agent');
  await recordAudit(sql, who, 'agent.deleted', { type: 'agent', id }, { name: current.name });
}

export interface AgentListQuery {
  search?: string | undefined;
  runtime?: string | undefined;
  environment_id?: string | undefined;
  has_skills?: 'true' | 'false' | undefined;
  has_mcp?: 'true' | 'false' | undefined;
}

export async function listAgents(sql: Sql, accountId: string, q: AgentListQuery) {
  const flag = (v: 'true' | 'false' | undefined) => (v === undefined ? undefined : v === 'true');
  return agents.listAgents(sql, accountId, {
    search: q.search,
    runtime: q.runtime,
    environmentId: q.environment_id,
    hasSkills: flag(q.has_skills),
    hasMcp: flag(q.has_mcp),
  });
}

/**
 * Stores an avatar after checking the bytes themselves: their signature must be png, jpeg, gif
 * or webp and agree with the declared type (415 otherwise), and they must fit in 5 MB (413).
 */
export async function putAvatar(sql: Sql, who: ActorRef, agentId: string, declaredType: string, bytes: Uint8Array) {
  await getAgent(sql, who.accountId, agentId);
  const declared = declaredType.split(';')[0]?.trim().toLowerCase() ?? '';
  if (!(AVATAR_TYPES as readonly string[]).includes(declared)) {
    throw new ApiError('unsupported_media_type', `Avatars are ${AVATAR_TYPES.join(', ')}.`);
  }
  if (bytes.length > AVATAR_MAX_BYTES) throw tooLarge('The avatar', AVATAR_MAX_BYTES, bytes.length);
  const sniffed = sniffImage(bytes);
  if (sniffed !== declared) {
    throw new ApiError(
      'unsupported_media_type',
      sniffed ? `The bytes are ${sniffed}, not ${declared}.` : 'The bytes are not an image.',
    );
  }
  await agents.putAvatar(sql, who.accountId, agentId, sniffed, bytes);
  await recordAudit(
    sql,
    who,
    'agent.avatar.updated',
    { type: 'agent', id: agentId },
    { media_type: sniffed, bytes: bytes.length },
  );
  return getAgent(sql, who.accountId, agentId);
}

/** The stored avatar, re-checked: a stored type that is not (or no longer matches) an image is 404. */
export async function getAvatar(sql: Sql, accountId: string, agentId: string) {
  const avatar = await agents.getAvatar(sql, accountId, agentId);
  if (
    !avatar ||
    !(AVATAR_TYPES as readonly string[]).includes(avatar.media_type) ||
    sniffImage(avatar.bytes) !== avatar.media_type
  ) {
    throw new ApiError('not_found', 'No avatar.');
  }
  return avatar;
}

export async function deleteAvatar(sql: Sql, who: ActorRef, agentId: string) {
  await getAgent(sql, who.accountId, agentId);
  if (await agents.deleteAvatar(sql, who.accountId, agentId)) {
    await recordAudit(sql, who, 'agent.avatar.deleted', { type: 'agent', id: agentId });
  }
}
