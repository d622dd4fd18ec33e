import { ApiError } from '@svc/core';
import { conversations, type Sql, schedules, transaction } from '@svc/db';
import { startConversation } from './launch.ts';
import type { LaunchDeps } from './launch-deps.ts';
import type { ActorRef } from './principal.ts';
import { getSchedule, recordScheduleChange } from './schedules.ts';
import { messageTeammate } from './team.ts';

/*
 * A schedule's run, whether asked for (run now) or due (the scheduler): where the prompt goes,
 * and the stamp of the outcome (`last_run_at`, `last_error`, `last_conversation_id`), its
 * `team.schedule.run` audit row and the `schedule` change event, written together.
 */

export interface RunDeps {
  sql: Sql;
  launch: LaunchDeps;
  /** The clock `last_run_at` is read from. */
  now: () => Date;
}

export type RunTrigger = 'now' | 'cron';

/** A run's outcome: the conversation the prompt went to, or why it went nowhere. */
export type RunResult = { conversationId: string; error: null } | { conversationId: null; error: ApiError };

/**
 * What the scheduler's claim adds to a run: the conversation id chosen at claim time, and what
 * the stamp moves and checks (`schedules.ClaimAdvance`: the slot the schedule moves to, the
 * claim's lease and slot as claimed).
 */
export interface ClaimedRun extends schedules.ClaimAdvance {
  conversationId: string;
}

/** The turn an in-thread run claimed as `cnv_<suffix>` opens: `trn_<suffix>`. */
export function claimedTurnId(claimedConversationId: string): string {
  return `trn_${claimedConversationId.slice(claimedConversationId.indexOf('_') + 1)}`;
}

/**
 * Sends the schedule's prompt where it belongs and stamps the outcome. `one_off: true` opens a
 * fresh conversation for the agent (its own environment, a new ephemeral machine even for a
 * persistent agent, gone when the conversation ends). An in-thread schedule
 * (`one_off: false`) is a message to the agent's teammate (messageTeammate: its live
 * conversation, or a fresh one when that cannot be resumed; 400 `conversation_busy` while a
 * turn runs, 503 while its machine starts); until the agent is on the team it is 404
 * `not_found`. Never throws for a run that could not start: the caller decides whether the
 * error is answered (run now) or only recorded (the scheduler).
 *
 * With `claim`, the run is pinned to an id chosen at claim time: a one-off launch uses the
 * claim's conversation id, an in-thread message the turn id of the same suffix
 * (claimedTurnId). A conversation or turn that already has it means an earlier claimant sent
 * the run and died before stamping: that is the run, stamped now, never a second one.
 */
export async function fireSchedule(
  deps: RunDeps,
  who: ActorRef,
  row: schedules.ScheduleRow,
  trigger: RunTrigger,
  claim?: ClaimedRun,
): Promise<RunResult> {
  let result: RunResult;
  const turnId = claim && !row.one_off ? claimedTurnId(claim.conversationId) : undefined;
  const launched = !claim
    ? undefined
    : turnId
      ? (await conversations.getTurn(deps.sql, who.accountId, turnId))?.conversation_id
      : (await conversations.getConversation(deps.sql, who.accountId, claim.conversationId))?.id;
  if (launched) {
    result = { conversationId: launched, error: null };
  } else {
    try {
      const conversationId = row.one_off
        ? (
            await startConversation(
              deps.launch,
              who,
              // A new machine for each run, whatever the agent's own sandbox_mode: a one-off run
              // never lands on the agent's lasting machine (its teammate's, when it is on the team).
              { agent_id: row.agent_id, prompt: row.prompt, sandbox_mode: 'ephemeral' },
              null,
              claim ? { conversationId: claim.conversationId } : {},
            )
          ).id
        : (await messageTeammate(deps, who, row.agent_id, { prompt: row.prompt }, turnId ? { turnId } : {}))
            .conversationId;
      result = { conversationId, error: null };
    } catch (err) {
      const error = err instanceof ApiError ? err : new ApiError('internal_error', 'The run could not start.');
      if (!(err instanceof ApiError)) deps.launch.logger.error({ err, scheduleId: row.id }, 'schedule run failed');
      result = { conversationId: null, error };
    }
  }
  await transaction(deps.sql, async (tx) => {
    const stamped = await schedules.stampRun(
      tx,
      who.accountId,
      row.id,
      { at: deps.now(), conversationId: result.conversationId, error: result.error?.message ?? null },
      claim,
    );
    if (!stamped) return;
    await recordScheduleChange(tx, who, 'run', row.id, {
      agent_id: row.agent_id,
      trigger,
      conversation_id: result.conversationId,
      error: result.error?.code ?? null,
    });
  });
  return result;
}

/** Run now: 202 `{status: queued, conversation_id}`, or the error that kept the run from starting. */
export async function runScheduleNow(deps: RunDeps, who: ActorRef, agentId: string, id: string) {
  const row = await getSchedule(deps.sql, who.accountId, agentId, id);
  const result = await fireSchedule(deps, who, row, 'now');
  if (result.error) throw result.error;
  return { status: 'queued' as const, conversation_id: result.conversationId };
}
