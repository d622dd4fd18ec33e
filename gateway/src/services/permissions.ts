import {
  ApiError,
  type NewEvent,
  orNotFound,
  PERMISSION_REQUEST_STAGE,
  PermissionRequestDone,
  PermissionRequestStarted,
  type RunnerEvent,
} from '@svc/core';
import { conversations, outbox, permissionRequests, type Sql, sandboxes } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';

export function shapePermissionRequest(row: permissionRequests.PermissionRequestRow) {
  return {
    id: row.id,
    conversation_id: row.conversation_id,
    turn_id: row.turn_id,
    status: row.status,
    resolution: row.resolution,
    option_id: row.option_id,
    options: row.options,
    created_at: row.created_at.toISOString(),
    resolved_at: row.resolved_at?.toISOString() ?? null,
  };
}

function parse<T>(schema: { safeParse(v: unknown): { success: true; data: T } | { success: false } }, data: string) {
  try {
    const r = schema.safeParse(JSON.parse(data));
    return r.success ? r.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Keeps the record of a runner's permission requests from its `request` stage events (the
 * fabric calls it for those only, before it appends them, so a request is on record before its
 * block can reach a client): `started` records it pending, `done` records how the runner
 * resolved it. Malformed data is logged and skipped: a runner's bad report must not stop its
 * output.
 */
export async function recordPermissionStage(
  deps: { sql: Sql; logger: Logger },
  accountId: string,
  e: RunnerEvent,
): Promise<void> {
  if (e.stage !== PERMISSION_REQUEST_STAGE || !e.data) return;
  try {
    if (e.state === 'started') {
      const started = parse(PermissionRequestStarted, e.data);
      if (!started) throw new Error('request started without a request id and options');
      await permissionRequests.insertPending(deps.sql, {
        id: started.request_id,
        accountId,
        conversationId: e.conversation_id,
        turnId: e.turn_id ?? null,
        options: started.options,
      });
    } else if (e.state === 'done') {
      const done = parse(PermissionRequestDone, e.data);
      if (!done) throw new Error('request done without a request id and resolution');
      // Requests the policy answered were never recorded; there is nothing to resolve.
      if (done.resolution === 'policy') return;
      await permissionRequests.resolvedOnRunner(deps.sql, accountId, done.request_id, done.resolution, done.option_id);
    }
  } catch (err) {
    deps.logger.warn(
      { err: { message: (err as Error).message }, conversation: e.conversation_id },
      'permission request not recorded',
    );
  }
}

/**
 * `POST /api/conversations/:id/requests/:request_id`: the first answer wins. The request is
 * resolved in Postgres (compare-and-set on `pending`), then the answer goes to the runner; when
 * the runner cannot take it (503 `runner_offline`) the answer is undone so another may win.
 * A sandbox token may not answer (403 `sprite_may_not_answer`); an unknown request, or one of
 * another tenant, is 404; a resolved one 409 `permission_request_resolved`; an option that was
 * not offered 422 `unknown_option`, and changes nothing.
 */
export async function answerPermissionRequest(
  deps: { sql: Sql; fabric: RunnerFabric },
  who: ActorRef,
  conversationId: string,
  requestId: string,
  optionId: string,
) {
  if (who.actor === 'sprite') throw new ApiError('sprite_may_not_answer');
  const { sql } = deps;
  const conversation = orNotFound(
    await conversations.getConversation(sql, who.accountId, conversationId),
    'Conversation',
  );
  if (conversation.status === 'terminated') throw new ApiError('conversation_terminated');
  const request = orNotFound(
    await permissionRequests.getRequest(sql, who.accountId, conversationId, requestId),
    'Permission request',
  );
  if (request.status !== 'pending') throw resolved(request);
  if (!request.options.some((o) => o.optionId === optionId)) {
    const offered = request.options.map((o) => o.optionId);
    throw new ApiError('unknown_option', `option_id must be one of the offered options: ${offered.join(', ')}.`, {
      extra: { options: offered },
    });
  }
  const sandbox = conversation.sandbox_id
    ? await sandboxes.getSandbox(sql, who.accountId, conversation.sandbox_id)
    : undefined;
  if (!sandbox?.runner_id) throw new ApiError('runner_offline');

  const won = await permissionRequests.answer(sql, who.accountId, requestId, optionId);
  if (!won) {
    const now = await permissionRequests.getRequest(sql, who.accountId, conversationId, requestId);
    throw now ? resolved(now) : new ApiError('not_found', 'Permission request not found.');
  }
  try {
    await deps.fabric.command(sandbox.runner_id, {
      kind: 'permission.answer',
      sandbox: sandbox.id,
      conversation_id: conversationId,
      request_id: requestId,
      option_id: optionId,
    });
  } catch (err) {
    await permissionRequests.reopen(sql, who.accountId, requestId, optionId);
    throw err;
  }
  await recordAudit(
    sql,
    who,
    'permission_request.answered',
    { type: 'permission_request', id: requestId },
    { conversation_id: conversationId, option_id: optionId },
  );
  return shapePermissionRequest(won);
}

function resolved(row: permissionRequests.PermissionRequestRow): ApiError {
  return new ApiError(
    'permission_request_resolved',
    `The permission request was already resolved (${row.resolution}${row.option_id ? `: ${row.option_id}` : ''}).`,
    { extra: { request: shapePermissionRequest(row) } },
  );
}

/**
 * The `request` `done` events for requests a turn's end resolved on the service (its runner
 * never reported them: it went away), so the log says how each one ended.
 */
export function turnEndEvents(rows: permissionRequests.PermissionRequestRow[]): NewEvent[] {
  return rows.map((r) => ({
    conversationId: r.conversation_id,
    turnId: r.turn_id,
    kind: 'stage',
    stream: 'stage',
    stage: PERMISSION_REQUEST_STAGE,
    state: 'done',
    data: JSON.stringify({ request_id: r.id, resolution: 'turn_end', option_id: null } satisfies PermissionRequestDone),
  }));
}

/**
 * Ends a running turn (conversations.endTurn: once) and, in the same transaction, resolves its
 * requests still pending as `turn_end`, with their `request` `done` events beside `events`: no
 * request stays pending in Postgres after its turn ended. False when the turn had already ended.
 */
export async function endTurnResolvingRequests(
  sql: Sql,
  accountId: string,
  turnId: string,
  state: 'done' | 'failed' | 'interrupted' | 'timeout',
  usage: conversations.TurnRow['usage'],
  events: NewEvent[],
  reply: string | null = null,
  error: conversations.TurnRow['error'] = null,
): Promise<boolean> {
  return sql
    .begin(async (tx) => {
      const t = tx as unknown as Sql;
      const expired = await permissionRequests.expireForTurn(t, accountId, turnId);
      const ended = await conversations.endTurn(
        t,
        accountId,
        turnId,
        state,
        usage,
        [...turnEndEvents(expired), ...events],
        reply,
        error,
      );
      // A turn that had already ended keeps whatever its requests were.
      if (!ended) throw new TurnAlreadyEnded();
      return true;
    })
    .catch((err: unknown) => {
      if (err instanceof TurnAlreadyEnded) return false;
      throw err;
    }) as Promise<boolean>;
}

class TurnAlreadyEnded extends Error {}

/**
 * A turn the service ended on its own (terminate): its requests still pending are resolved
 * (`turn_end`), with their `request` done events, so none is left waiting.
 */
export async function resolveRequestsOfTurn(sql: Sql, accountId: string, turnId: string): Promise<void> {
  await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    const expired = await permissionRequests.expireForTurn(t, accountId, turnId);
    await outbox.enqueue(t, accountId, turnEndEvents(expired));
  });
}
