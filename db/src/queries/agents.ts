import type postgres from 'postgres';
import type { Sql } from '../connect.ts';
import { deleteOwned, nameTakenByAnother } from './owned.ts';

export interface AgentValues {
  name: string;
  description: string;
  system: string;
  runtime: string;
  model: string;
  environment_id: string;
  skills: unknown[];
  mcp_servers: Record<string, { command: string; args: string[] }>;
  sandbox_provider: string | null;
  sandbox_mode: string;
  allowed_vault_ids: string[] | null;
  allowed_environment_ids: string[] | null;
  permission_policy: { default: string; ask: string[] };
}

export interface AgentRow extends AgentValues {
  id: string;
  avatar_media_type: string | null;
  conversation_count: number;
  created_at: Date;
  updated_at: Date;
}

const json = (sql: Sql, v: unknown) => sql.json(v as postgres.JSONValue);

function selectAgents(sql: Sql) {
  return sql`
    SELECT a.*, av.media_type AS avatar_media_type,
      (SELECT count(*)::int FROM conversations c WHERE c.account_id = a.account_id AND c.agent_id = a.id) AS conversation_count
    FROM agents a LEFT JOIN agent_avatars av ON av.agent_id = a.id`;
}

export interface AgentFilter {
  search?: string | undefined;
  runtime?: string | undefined;
  environmentId?: string | undefined;
  hasSkills?: boolean | undefined;
  hasMcp?: boolean | undefined;
}

export async function listAgents(sql: Sql, accountId: string, f: AgentFilter = {}): Promise<AgentRow[]> {
  const like = f.search ? `%${f.search.replace(/[\\%_]/g, (c) => `\\${c}`)}%` : undefined;
  return sql<AgentRow[]>`
    ${selectAgents(sql)}
    WHERE a.account_id = ${accountId}
      ${like ? sql`AND (a.name ILIKE ${like} OR a.description ILIKE ${like})` : sql``}
      ${f.runtime ? sql`AND a.runtime = ${f.runtime}` : sql``}
      ${f.environmentId ? sql`AND a.environment_id = ${f.environmentId}` : sql``}
      ${f.hasSkills === undefined ? sql`` : f.hasSkills ? sql`AND jsonb_array_length(a.skills) > 0` : sql`AND jsonb_array_length(a.skills) = 0`}
      ${f.hasMcp === undefined ? sql`` : f.hasMcp ? sql`AND a.mcp_servers <> '{}'::jsonb` : sql`AND a.mcp_servers = '{}'::jsonb`}
    ORDER BY a.created_at, a.id`;
}

export async function getAgent(sql: Sql, accountId: string, id: string): Promise<AgentRow | undefined> {
  const rows = await sql<AgentRow[]>`${selectAgents(sql)} WHERE a.account_id = ${accountId} AND a.id = ${id}`;
  return rows[0];
}

export async function findAgentByName(sql: Sql, accountId: string, name: string): Promise<AgentRow | undefined> {
  const rows = await sql<AgentRow[]>`${selectAgents(sql)} WHERE a.account_id = ${accountId} AND a.name = ${name}`;
  return rows[0];
}

/**
 * Inserts; undefined when the account already has an agent of that name. The new row is
 * returned as inserted (no avatar, no conversations yet), not read back: a read by id in the
 * same request cost a second round trip, and on a table too new to have statistics Postgres
 * may keep a plan for that read which scans every agent of the account.
 */
export async function insertAgent(
  sql: Sql,
  accountId: string,
  id: string,
  v: AgentValues,
): Promise<AgentRow | undefined> {
  const rows = await sql<Omit<AgentRow, 'avatar_media_type' | 'conversation_count'>[]>`
    INSERT INTO agents (id, account_id, name, description, system, runtime, model, environment_id, skills,
                        mcp_servers, sandbox_provider, sandbox_mode, allowed_vault_ids, allowed_environment_ids,
                        permission_policy)
    VALUES (${id}, ${accountId}, ${v.name}, ${v.description}, ${v.system}, ${v.runtime}, ${v.model}, ${v.environment_id},
            ${json(sql, v.skills)}, ${json(sql, v.mcp_servers)}, ${v.sandbox_provider}, ${v.sandbox_mode},
            ${v.allowed_vault_ids}, ${v.allowed_environment_ids}, ${json(sql, v.permission_policy)})
    ON CONFLICT (account_id, name) DO NOTHING
    RETURNING *`;
  const row = rows[0];
  return row && { ...row, avatar_media_type: null, conversation_count: 0 };
}

/** Replaces every field; 'conflict' when the new name belongs to another agent of the account. */
export async function updateAgent(
  sql: Sql,
  accountId: string,
  id: string,
  v: AgentValues,
): Promise<AgentRow | undefined | 'conflict'> {
  if (await nameTakenByAnother(sql, 'agents', accountId, v.name, id)) return 'conflict';
  const rows = await sql`
    UPDATE agents SET name = ${v.name}, description = ${v.description}, system = ${v.system}, runtime = ${v.runtime},
      model = ${v.model}, environment_id = ${v.environment_id}, skills = ${json(sql, v.skills)},
      mcp_servers = ${json(sql, v.mcp_servers)}, sandbox_provider = ${v.sandbox_provider},
      sandbox_mode = ${v.sandbox_mode}, allowed_vault_ids = ${v.allowed_vault_ids},
      allowed_environment_ids = ${v.allowed_environment_ids}, permission_policy = ${json(sql, v.permission_policy)},
      updated_at = now()
    WHERE account_id = ${accountId} AND id = ${id}
    RETURNING id`;
  return rows.length ? getAgent(sql, accountId, id) : undefined;
}

export async function deleteAgent(sql: Sql, accountId: string, id: string): Promise<boolean> {
  return deleteOwned(sql, 'agents', accountId, id);
}

/** The ids among `ids` that are environments of the account. */
export async function existingEnvironmentIds(
  sql: Sql,
  accountId: string,
  ids: readonly string[],
): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await sql<{ id: string }[]>`
    SELECT id FROM environments WHERE account_id = ${accountId} AND id = ANY(${ids as string[]})`;
  return new Set(rows.map((r) => r.id));
}

export async function getAvatar(sql: Sql, accountId: string, agentId: string) {
  const rows = await sql<{ media_type: string; bytes: Uint8Array }[]>`
    SELECT media_type, bytes FROM agent_avatars WHERE account_id = ${accountId} AND agent_id = ${agentId}`;
  return rows[0];
}

export async function putAvatar(sql: Sql, accountId: string, agentId: string, mediaType: string, bytes: Uint8Array) {
  await sql`INSERT INTO agent_avatars (agent_id, account_id, media_type, bytes)
            VALUES (${agentId}, ${accountId}, ${mediaType}, ${bytes})
            ON CONFLICT (agent_id) DO UPDATE SET media_type = excluded.media_type, bytes = excluded.bytes, updated_at = now()`;
}

export async function deleteAvatar(sql: Sql, accountId: string, agentId: string): Promise<boolean> {
  const rows =
    await sql`DELETE FROM agent_avatars WHERE account_id = ${accountId} AND agent_id = ${agentId} RETURNING agent_id`;
  return rows.length === 1;
}
