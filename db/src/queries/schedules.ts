import type { Sql } from '../connect.ts';

export interface ScheduleValues {
  name: string;
  cron: string;
  prompt: string;
  one_off: boolean;
  enabled: boolean;
  next_run_at: Date | null;
}

export interface ScheduleRow extends ScheduleValues {
  id: string;
  account_id: string;
  agent_id: string;
  last_run_at: Date | null;
  last_conversation_id: string | null;
  last_error: string | null;
  created_at: Date;
  updated_at: Date;
}

/** The account's schedules (of one agent when `agentId` is given), soonest first, disabled last. */
export async function listSchedules(sql: Sql, accountId: string, agentId?: string): Promise<ScheduleRow[]> {
  return sql<ScheduleRow[]>`
    SELECT * FROM schedules
    WHERE account_id = ${accountId} ${agentId === undefined ? sql`` : sql`AND agent_id = ${agentId}`}
    ORDER BY next_run_at NULLS LAST, id`;
}

/** The schedule `id` of the account's agent `agentId`; a row under another agent reads as missing. */
export async function getSchedule(
  sql: Sql,
  accountId: string,
  agentId: string,
  id: string,
): Promise<ScheduleRow | undefined> {
  const rows = await sql<ScheduleRow[]>`
    SELECT * FROM schedules WHERE account_id = ${accountId} AND agent_id = ${agentId} AND id = ${id}`;
  return rows[0];
}

export async function insertSchedule(
  sql: Sql,
  accountId: string,
  agentId: string,
  id: string,
  v: ScheduleValues,
): Promise<ScheduleRow> {
  const rows = await sql<ScheduleRow[]>`
    INSERT INTO schedules (id, account_id, agent_id, name, cron, prompt, one_off, enabled, next_run_at)
    VALUES (${id}, ${accountId}, ${agentId}, ${v.name}, ${v.cron}, ${v.prompt}, ${v.one_off}, ${v.enabled}, ${v.next_run_at})
    RETURNING *`;
  return rows[0] as ScheduleRow;
}

/** Writes every value; undefined when the agent has no such schedule. */
export async function updateSchedule(
  sql: Sql,
  accountId: string,
  agentId: string,
  id: string,
  v: ScheduleValues,
): Promise<ScheduleRow | undefined> {
  const rows = await sql<ScheduleRow[]>`
    UPDATE schedules SET name = ${v.name}, cron = ${v.cron}, prompt = ${v.prompt}, one_off = ${v.one_off},
      enabled = ${v.enabled}, next_run_at = ${v.next_run_at}, updated_at = now()
    WHERE account_id = ${accountId} AND agent_id = ${agentId} AND id = ${id}
    RETURNING *`;
  return rows[0];
}

/** False when the agent has no such schedule. */
export async function deleteSchedule(sql: Sql, accountId: string, agentId: string, id: string): Promise<boolean> {
  const rows = await sql`
    DELETE FROM schedules WHERE account_id = ${accountId} AND agent_id = ${agentId} AND id = ${id} RETURNING id`;
  return rows.length === 1;
}

export interface RunOutcome {
  at: Date;
  /** The conversation the run went to, or null when it did not start. */
  conversationId: string | null;
  /** Why the run did not start; null when it did. */
  error: string | null;
}

/**
 * Stamps a run's outcome. `last_conversation_id` keeps the previous conversation when this run
 * started none. Undefined when the schedule is gone (deleted while it ran).
 */
export async function stampRun(
  sql: Sql,
  accountId: string,
  id: string,
  outcome: RunOutcome,
): Promise<ScheduleRow | undefined> {
  const rows = await sql<ScheduleRow[]>`
    UPDATE schedules SET last_run_at = ${outcome.at}, last_error = ${outcome.error},
      last_conversation_id = coalesce(${outcome.conversationId}, last_conversation_id)
    WHERE account_id = ${accountId} AND id = ${id}
    RETURNING *`;
  return rows[0];
}
