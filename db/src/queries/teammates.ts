import { TEAM_CHANNEL } from '@svc/core';
import type { Sql } from '../connect.ts';
import type { TurnRow } from './conversations.ts';

export interface TeammateRow {
  account_id: string;
  agent_id: string;
  /** The custom name; null keeps the agent's name. */
  name: string | null;
  /** The live conversation; null once it was deleted. */
  conversation_id: string | null;
  created_at: Date;
  updated_at: Date;
}

/** Puts the agent on the team with its live conversation; false when it already is (nothing changes). */
export async function insertTeammate(
  sql: Sql,
  t: { accountId: string; agentId: string; name: string | null; conversationId: string },
): Promise<boolean> {
  const rows = await sql`
    INSERT INTO teammates (account_id, agent_id, name, conversation_id)
    VALUES (${t.accountId}, ${t.agentId}, ${t.name}, ${t.conversationId})
    ON CONFLICT (account_id, agent_id) DO NOTHING RETURNING agent_id`;
  return rows.length === 1;
}

export async function getTeammate(sql: Sql, accountId: string, agentId: string): Promise<TeammateRow | undefined> {
  const rows = await sql<TeammateRow[]>`
    SELECT * FROM teammates WHERE account_id = ${accountId} AND agent_id = ${agentId}`;
  return rows[0];
}

/** The account's teammates, in the order they joined. */
export async function listTeammates(sql: Sql, accountId: string): Promise<TeammateRow[]> {
  return sql<TeammateRow[]>`
    SELECT * FROM teammates WHERE account_id = ${accountId} ORDER BY created_at, agent_id`;
}

/**
 * Points the teammate at a new live conversation, compare-and-set on the one it had
 * (`from`): of two requests that each opened a fresh conversation, one wins. False when the
 * teammate is gone or moved on meanwhile.
 */
export async function moveConversation(
  sql: Sql,
  accountId: string,
  agentId: string,
  from: string | null,
  to: string,
): Promise<boolean> {
  const rows = await sql`
    UPDATE teammates SET conversation_id = ${to}, updated_at = now()
    WHERE account_id = ${accountId} AND agent_id = ${agentId} AND conversation_id IS NOT DISTINCT FROM ${from}
    RETURNING agent_id`;
  return rows.length === 1;
}

/**
 * Sets the custom name and retitles the live conversation with `title` (the name, or the
 * agent's name when the custom one is cleared). Undefined when the agent is not on the team.
 */
export async function rename(
  sql: Sql,
  accountId: string,
  agentId: string,
  name: string | null,
  title: string,
): Promise<TeammateRow | undefined> {
  const rows = await sql<TeammateRow[]>`
    UPDATE teammates SET name = ${name}, updated_at = now()
    WHERE account_id = ${accountId} AND agent_id = ${agentId} RETURNING *`;
  const row = rows[0];
  if (row?.conversation_id) {
    await sql`UPDATE conversations SET title = ${title}, updated_at = now()
              WHERE account_id = ${accountId} AND id = ${row.conversation_id}`;
  }
  return row;
}

/**
 * Takes the agent off the team and unbinds its team history: its conversations leave the
 * team channel. False when it was not on the team.
 */
export async function removeTeammate(sql: Sql, accountId: string, agentId: string): Promise<boolean> {
  const rows = await sql`
    DELETE FROM teammates WHERE account_id = ${accountId} AND agent_id = ${agentId} RETURNING agent_id`;
  if (rows.length === 0) return false;
  await sql`UPDATE conversations SET channel_id = NULL, updated_at = now()
            WHERE account_id = ${accountId} AND agent_id = ${agentId} AND channel_id = ${TEAM_CHANNEL}`;
  return true;
}

/** What a roster entry's presence is computed from, per sandbox. */
export interface SandboxSignal {
  id: string;
  status: 'provisioning' | 'ready' | 'suspended' | 'terminated' | 'failed';
  provider: string;
  runner_id: string | null;
  incarnation: number;
  built_incarnation: number | null;
  runner_connected: boolean | null;
  runner_last_seen_at: Date | null;
}

/** The given sandboxes of the account with their runner's presence columns, in one query. */
export async function sandboxSignals(sql: Sql, accountId: string, sandboxIds: string[]): Promise<SandboxSignal[]> {
  if (sandboxIds.length === 0) return [];
  return sql<SandboxSignal[]>`
    SELECT s.id, s.status, s.provider, s.runner_id, s.incarnation, s.built_incarnation, r.connected AS runner_connected, r.last_seen_at AS runner_last_seen_at
    FROM sandboxes s LEFT JOIN runners r ON r.id = s.runner_id
    WHERE s.account_id = ${accountId} AND s.id = ANY(${sandboxIds})`;
}

/** The newest turn of each of the given conversations, in one query. */
export async function lastTurns(sql: Sql, accountId: string, conversationIds: string[]): Promise<TurnRow[]> {
  if (conversationIds.length === 0) return [];
  return sql<TurnRow[]>`
    SELECT DISTINCT ON (conversation_id) * FROM turns
    WHERE account_id = ${accountId} AND conversation_id = ANY(${conversationIds})
    ORDER BY conversation_id, number DESC`;
}

/** Usage summed per agent of `agentIds` over every conversation it has on the team channel. */
export async function teamUsage(
  sql: Sql,
  accountId: string,
  agentIds: string[],
): Promise<{ agent_id: string; input: string; output: string }[]> {
  if (agentIds.length === 0) return [];
  return sql`
    SELECT c.agent_id,
      coalesce(sum((t.usage->>'input')::bigint), 0)::text AS input,
      coalesce(sum((t.usage->>'output')::bigint), 0)::text AS output
    FROM conversations c JOIN turns t ON t.conversation_id = c.id
    WHERE c.account_id = ${accountId} AND c.channel_id = ${TEAM_CHANNEL} AND c.agent_id = ANY(${agentIds})
    GROUP BY c.agent_id`;
}
