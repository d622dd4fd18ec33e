import type { Sql } from '../connect.ts';

export type SandboxStatus = 'provisioning' | 'ready' | 'suspended' | 'terminated' | 'failed';

export interface SandboxRow {
  id: string;
  account_id: string;
  provider: 'runner' | 'local' | 'sprites' | 'e2b' | 'daytona';
  mode: 'ephemeral' | 'persistent';
  status: SandboxStatus;
  runner_id: string | null;
  agent_id: string;
  environment_id: string | null;
  vault_id: string | null;
  incarnation: number;
  created_at: Date;
  updated_at: Date;
}

export async function insertSandbox(
  sql: Sql,
  s: {
    id: string;
    accountId: string;
    provider: SandboxRow['provider'];
    mode: SandboxRow['mode'];
    runnerId: string | null;
    agentId: string;
    environmentId: string | null;
    vaultId: string | null;
  },
): Promise<SandboxRow | undefined> {
  // DO NOTHING: a persistent machine for the same identity is live already (unique index).
  const rows = await sql<SandboxRow[]>`
    INSERT INTO sandboxes (id, account_id, provider, mode, runner_id, agent_id, environment_id, vault_id)
    VALUES (${s.id}, ${s.accountId}, ${s.provider}, ${s.mode}, ${s.runnerId}, ${s.agentId}, ${s.environmentId}, ${s.vaultId})
    ON CONFLICT DO NOTHING
    RETURNING *`;
  return rows[0];
}

/** The identity's live persistent machine (provisioning, ready or suspended), if it has one. */
export async function persistentFor(
  sql: Sql,
  accountId: string,
  identity: { agentId: string; environmentId: string | null; vaultId: string | null },
): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`
    SELECT * FROM sandboxes
    WHERE account_id = ${accountId} AND agent_id = ${identity.agentId} AND mode = 'persistent'
      AND coalesce(environment_id, '') = ${identity.environmentId ?? ''} AND coalesce(vault_id, '') = ${identity.vaultId ?? ''}
      AND status IN ('provisioning', 'ready', 'suspended')`;
  return rows[0];
}

export async function getSandbox(sql: Sql, accountId: string, id: string): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`SELECT * FROM sandboxes WHERE account_id = ${accountId} AND id = ${id}`;
  return rows[0];
}

/** The sandbox if it is on this runner (a runner speaks only for its own sandboxes). */
export async function onRunner(sql: Sql, runnerId: string, id: string): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`SELECT * FROM sandboxes WHERE runner_id = ${runnerId} AND id = ${id}`;
  return rows[0];
}

/** Moves the status when it is still `from` (compare-and-set: two nodes never both move it). */
export async function moveStatus(sql: Sql, id: string, from: SandboxStatus[], to: SandboxStatus): Promise<boolean> {
  const rows = await sql`UPDATE sandboxes SET status = ${to}, updated_at = now()
                         WHERE id = ${id} AND status = ANY(${from}) RETURNING id`;
  return rows.length === 1;
}

/** Conversations on the sandbox (a runner's output may name only these). */
export async function conversationIds(sql: Sql, accountId: string, sandboxId: string): Promise<string[]> {
  const rows = await sql<{ id: string }[]>`
    SELECT id FROM conversations WHERE account_id = ${accountId} AND sandbox_id = ${sandboxId}`;
  return rows.map((r) => r.id);
}

/** The runner a sandbox lives on, once it has one (a local sandbox gets its runner after start). */
export async function setRunner(sql: Sql, id: string, runnerId: string): Promise<void> {
  await sql`UPDATE sandboxes SET runner_id = ${runnerId}, updated_at = now() WHERE id = ${id}`;
}

/**
 * Starts the next incarnation of a sandbox whose machine is gone: a clean machine for the
 * same identity, on `runnerId`. Compare-and-set on the status the caller saw; undefined when
 * it moved meanwhile.
 */
export async function rebuild(
  sql: Sql,
  id: string,
  runnerId: string | null,
  from: SandboxStatus,
): Promise<SandboxRow | undefined> {
  const rows = await sql<SandboxRow[]>`
    UPDATE sandboxes SET status = 'provisioning', incarnation = incarnation + 1, runner_id = ${runnerId}, updated_at = now()
    WHERE id = ${id} AND status = ${from} RETURNING *`;
  return rows[0];
}
