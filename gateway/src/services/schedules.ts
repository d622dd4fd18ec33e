import { newId, orNotFound, type Schedule, type ScheduleCreate, type SchedulePatch } from '@svc/core';
import { agents, outbox, type Sql, schedules, transaction } from '@svc/db';
import type { z } from 'zod';
import { recordAudit } from './audit.ts';
import { nextSlot } from './cron.ts';
import type { ActorRef } from './principal.ts';
import { changed } from './tenant-events.ts';

/*
 * Schedules: cron routines that prompt an agent. Every write records its
 * audit row and the tenant's `schedule` change event in the transaction of the change.
 */

export interface ScheduleDeps {
  sql: Sql;
  /** The clock `next_run_at` is computed from. */
  now: () => Date;
}

export function shapeSchedule(row: schedules.ScheduleRow): z.infer<typeof Schedule> {
  const iso = (d: Date | null) => (d === null ? null : d.toISOString());
  return {
    id: row.id,
    agent_id: row.agent_id,
    name: row.name,
    cron: row.cron,
    prompt: row.prompt,
    one_off: row.one_off,
    enabled: row.enabled,
    next_run_at: iso(row.next_run_at),
    last_run_at: iso(row.last_run_at),
    last_conversation_id: row.last_conversation_id,
    last_error: row.last_error,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}

/** The next slot after `now`, or null for a disabled schedule (it never comes due). */
export function nextRunAt(cron: string, enabled: boolean, now: Date): Date | null {
  const next = nextSlot(cron, now);
  return enabled ? next : null;
}

/**
 * What every write of a schedule records in the transaction `tx` of the change: the tenant's
 * `schedule` change event and the audit row `team.schedule.<action>` (facts, never the prompt).
 */
export async function recordScheduleChange(
  tx: Sql,
  who: ActorRef,
  action: 'create' | 'update' | 'delete' | 'run',
  scheduleId: string,
  metadata: Record<string, unknown>,
): Promise<void> {
  await outbox.enqueue(tx, who.accountId, [changed('schedule')]);
  await recordAudit(tx, who, `team.schedule.${action}`, { type: 'schedule', id: scheduleId }, metadata);
}

async function ownAgent(sql: Sql, accountId: string, agentId: string) {
  return orNotFound(await agents.getAgent(sql, accountId, agentId), 'Agent');
}

/** Every schedule of the account, soonest first (disabled ones last). */
export async function listAllSchedules(sql: Sql, accountId: string) {
  return schedules.listSchedules(sql, accountId);
}

/** The agent's schedules; 404 when the agent is not the caller's. */
export async function listAgentSchedules(sql: Sql, accountId: string, agentId: string) {
  await ownAgent(sql, accountId, agentId);
  return schedules.listSchedules(sql, accountId, agentId);
}

/** One schedule, addressed under its own agent: under another agent's path it is 404. */
export async function getSchedule(sql: Sql, accountId: string, agentId: string, id: string) {
  return orNotFound(await schedules.getSchedule(sql, accountId, agentId, id), 'Schedule');
}

/** Creates a schedule for the caller's agent (it need not be on the team). */
export async function createSchedule(
  deps: ScheduleDeps,
  who: ActorRef,
  agentId: string,
  input: z.infer<typeof ScheduleCreate>,
) {
  await ownAgent(deps.sql, who.accountId, agentId);
  const enabled = input.enabled ?? true;
  const values: schedules.ScheduleValues = {
    name: input.name ?? '',
    cron: input.cron,
    prompt: input.prompt,
    one_off: input.one_off ?? false,
    enabled,
    next_run_at: nextRunAt(input.cron, enabled, deps.now()),
  };
  return transaction(deps.sql, async (tx) => {
    const row = await schedules.insertSchedule(tx, who.accountId, agentId, newId('sch'), values);
    await recordScheduleChange(tx, who, 'create', row.id, {
      agent_id: agentId,
      cron: row.cron,
      one_off: row.one_off,
      enabled: row.enabled,
    });
    return row;
  });
}

/**
 * Writes the fields given. `next_run_at` is computed again when `cron` or `enabled` is given,
 * from now; otherwise a slot already due stays due.
 */
export async function updateSchedule(
  deps: ScheduleDeps,
  who: ActorRef,
  agentId: string,
  id: string,
  patch: z.infer<typeof SchedulePatch>,
) {
  const current = await getSchedule(deps.sql, who.accountId, agentId, id);
  const values: Parameters<typeof schedules.updateSchedule>[4] = {
    name: patch.name ?? current.name,
    cron: patch.cron ?? current.cron,
    prompt: patch.prompt ?? current.prompt,
    one_off: patch.one_off ?? current.one_off,
    enabled: patch.enabled ?? current.enabled,
  };
  if (patch.cron !== undefined || patch.enabled !== undefined) {
    values.next_run_at = nextRunAt(values.cron, values.enabled, deps.now());
  }
  return transaction(deps.sql, async (tx) => {
    const row = orNotFound(await schedules.updateSchedule(tx, who.accountId, agentId, id, values), 'Schedule');
    await recordScheduleChange(tx, who, 'update', id, { agent_id: agentId, fields: Object.keys(patch).sort() });
    return row;
  });
}

export async function deleteSchedule(deps: Pick<ScheduleDeps, 'sql'>, who: ActorRef, agentId: string, id: string) {
  await transaction(deps.sql, async (tx) => {
    orNotFound(await schedules.deleteSchedule(tx, who.accountId, agentId, id), 'Schedule');
    await recordScheduleChange(tx, who, 'delete', id, { agent_id: agentId });
  });
}
