import type postgres from 'postgres';
import type { Sql } from '../connect.ts';
import { deleteOwned, nameTakenByAnother } from './owned.ts';

export interface EnvironmentValues {
  name: string;
  packages: Record<string, unknown>;
  env_vars: Record<string, string>;
  repositories: { url: string; mount_path: string }[];
  setup_script: string;
  networking_type: string;
  networking_config: { allowed_hosts: string[] } | null;
}

export interface EnvironmentRow extends EnvironmentValues {
  id: string;
  secret_count: number;
  agent_count: number;
  created_at: Date;
  updated_at: Date;
}

const json = (sql: Sql, v: unknown) => sql.json(v as postgres.JSONValue);

function selectWithCounts(sql: Sql) {
  return sql`
    SELECT e.*,
      (SELECT count(*)::int FROM environment_secrets s WHERE s.environment_id = e.id) AS secret_count,
      (SELECT count(*)::int FROM agents a WHERE a.environment_id = e.id AND a.account_id = e.account_id) AS agent_count
    FROM environments e`;
}

/** Inserts; undefined when the account already has an environment of that name. */
export async function insertEnvironment(
  sql: Sql,
  accountId: string,
  id: string,
  v: EnvironmentValues,
): Promise<EnvironmentRow | undefined> {
  const rows = await sql<{ id: string }[]>`
    INSERT INTO environments (id, account_id, name, packages, env_vars, repositories, setup_script,
                              networking_type, networking_config)
    VALUES (${id}, ${accountId}, ${v.name}, ${json(sql, v.packages)}, ${json(sql, v.env_vars)},
            ${json(sql, v.repositories)}, ${v.setup_script}, ${v.networking_type},
            ${v.networking_config === null ? null : json(sql, v.networking_config)})
    ON CONFLICT (account_id, name) DO NOTHING
    RETURNING id`;
  return rows[0] ? getEnvironment(sql, accountId, id) : undefined;
}

/** Replaces every field; 'conflict' when the new name belongs to another environment of the account. */
export async function updateEnvironment(
  sql: Sql,
  accountId: string,
  id: string,
  v: EnvironmentValues,
): Promise<EnvironmentRow | undefined | 'conflict'> {
  if (await nameTakenByAnother(sql, 'environments', accountId, v.name, id)) return 'conflict';
  const rows = await sql`
    UPDATE environments SET name = ${v.name}, packages = ${json(sql, v.packages)}, env_vars = ${json(sql, v.env_vars)},
      repositories = ${json(sql, v.repositories)}, setup_script = ${v.setup_script},
      networking_type = ${v.networking_type},
      networking_config = ${v.networking_config === null ? null : json(sql, v.networking_config)}, updated_at = now()
    WHERE account_id = ${accountId} AND id = ${id}
    RETURNING id`;
  return rows.length ? getEnvironment(sql, accountId, id) : undefined;
}

export async function getEnvironment(sql: Sql, accountId: string, id: string): Promise<EnvironmentRow | undefined> {
  const rows = await sql<EnvironmentRow[]>`${selectWithCounts(sql)} WHERE e.account_id = ${accountId} AND e.id = ${id}`;
  return rows[0];
}

export async function findEnvironmentByName(
  sql: Sql,
  accountId: string,
  name: string,
): Promise<EnvironmentRow | undefined> {
  const rows = await sql<
    EnvironmentRow[]
  >`${selectWithCounts(sql)} WHERE e.account_id = ${accountId} AND e.name = ${name}`;
  return rows[0];
}

export async function listEnvironments(sql: Sql, accountId: string): Promise<EnvironmentRow[]> {
  return sql<EnvironmentRow[]>`${selectWithCounts(sql)} WHERE e.account_id = ${accountId} ORDER BY e.created_at, e.id`;
}

/** Deletes unless agents still use it: 'in_use' then, false when there is no such environment. */
export async function deleteEnvironment(sql: Sql, accountId: string, id: string): Promise<boolean | 'in_use'> {
  const used = await sql`SELECT 1 FROM agents WHERE account_id = ${accountId} AND environment_id = ${id} LIMIT 1`;
  if (used.length) return 'in_use';
  return deleteOwned(sql, 'environments', accountId, id);
}
