import { type Sql, transaction } from '../connect.ts';

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
  claimed_until: Date | null;
  claim_conversation_id: string | null;
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

/**
 * Writes every value; `next_run_at` only when given, so an edit that leaves the timing alone
 * never puts back a slot the scheduler has moved on from meanwhile. A new `next_run_at` also
 * forgets the conversation id of a claim on the row: a claimant that died is taken over for the
 * new slot, which then gets its own launch instead of passing off the old slot's as its run
 * (a claimant still at work launches under the id it holds, and stamps under its lease).
 * Undefined when the agent has no such schedule.
 */
export async function updateSchedule(
  sql: Sql,
  accountId: string,
  agentId: string,
  id: string,
  v: Omit<ScheduleValues, 'next_run_at'> & { next_run_at?: Date | null },
): Promise<ScheduleRow | undefined> {
  const rows = await sql<ScheduleRow[]>`
    UPDATE schedules SET name = ${v.name}, cron = ${v.cron}, prompt = ${v.prompt}, one_off = ${v.one_off},
      enabled = ${v.enabled}, updated_at = now()
      ${v.next_run_at === undefined ? sql`` : sql`, next_run_at = ${v.next_run_at}, claim_conversation_id = NULL`}
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

/** What a run of the scheduler's claim stamps besides its outcome. */
export interface ClaimAdvance {
  /** The slot the schedule moves to (null: it stops). */
  nextRunAt: Date | null;
  /** The claim's lease (`claimed_until` as claimed): the stamp is this claim's only while it holds. */
  lease: Date;
  /** `next_run_at` as claimed: an edit that moved it since (new cron, disabled) keeps its own. */
  slot: Date | null;
}

/**
 * Stamps a run's outcome. `last_conversation_id` keeps the previous conversation when this run
 * started none. With `advance` (a run of the scheduler's claim), only while that claim still
 * holds the row (compare-and-set on its lease: a claimant that outlived its lease, whose row
 * another took over, stamps nothing), the claim is released and `next_run_at` moves to the
 * slot given unless an edit moved it meanwhile. Undefined when nothing was stamped (the
 * schedule is gone, or the claim is no longer this one).
 */
export async function stampRun(
  sql: Sql,
  accountId: string,
  id: string,
  outcome: RunOutcome,
  advance?: ClaimAdvance,
): Promise<ScheduleRow | undefined> {
  const rows = await sql<ScheduleRow[]>`
    UPDATE schedules SET last_run_at = ${outcome.at}, last_error = ${outcome.error},
      last_conversation_id = coalesce(${outcome.conversationId}, last_conversation_id)
      ${
        advance
          ? sql`, next_run_at = CASE WHEN next_run_at IS NOT DISTINCT FROM ${advance.slot}::timestamptz
                  THEN ${advance.nextRunAt}::timestamptz ELSE next_run_at END,
                claimed_until = NULL, claim_conversation_id = NULL`
          : sql``
      }
    WHERE account_id = ${accountId} AND id = ${id}
      ${advance ? sql`AND claimed_until = ${advance.lease}` : sql``}
    RETURNING *`;
  return rows[0];
}

/**
 * Claims up to `limit` schedules due at `now` (enabled, `next_run_at` passed) that no live lease
 * holds, for `leaseUntil`. Rows another transaction is claiming are skipped (`FOR UPDATE SKIP
 * LOCKED`), so concurrent workers never claim one row twice; a lease that expired (its worker
 * died) is claimed again. A row keeps the `claim_conversation_id` of an expired claim, so the
 * next claimant launches under the same id; `newConversationId` names a first claim's.
 */
export async function claimDue(
  sql: Sql,
  now: Date,
  leaseUntil: Date,
  limit: number,
  newConversationId: () => string,
): Promise<ScheduleRow[]> {
  return transaction(sql, async (tx) => {
    const due = await tx<{ id: string; claim_conversation_id: string | null }[]>`
      SELECT id, claim_conversation_id FROM schedules
      WHERE enabled AND next_run_at <= ${now} AND (claimed_until IS NULL OR claimed_until <= ${now})
      ORDER BY next_run_at LIMIT ${limit}
      FOR UPDATE SKIP LOCKED`;
    const claimed: ScheduleRow[] = [];
    for (const row of due) {
      const [updated] = await tx<ScheduleRow[]>`
        UPDATE schedules SET claimed_until = ${leaseUntil},
          claim_conversation_id = ${row.claim_conversation_id ?? newConversationId()}
        WHERE id = ${row.id} RETURNING *`;
      if (updated) claimed.push(updated);
    }
    return claimed;
  });
}
