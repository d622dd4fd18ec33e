import { ApiError, blocksOf, CONVERSATION_STATUSES, LOG_STREAMS, newId, orNotFound, type TurnError } from '@svc/core';
import { conversations, credentials, type Sql } from '@svc/db';
import type { EventLog, LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { recordAudit } from './audit.ts';
import { csv } from './list-params.ts';
import type { ActorRef } from './principal.ts';
import { changed } from './tenant-events.ts';

export function shapeConversation(row: conversations.ConversationRow) {
  return {
    id: row.id,
    title: row.title,
    status: row.status,
    source: row.source,
    parent_id: row.parent_id,
    agent_id: row.agent_id,
    sandbox_id: row.sandbox_id,
    channel_id: row.channel_id,
    turn_count: row.turn_count,
    last_active_at: row.last_active_at.toISOString(),
    last_read_at: row.last_read_at?.toISOString() ?? null,
    unread: row.last_read_at === null || row.last_active_at > row.last_read_at,
    usage_total: { input: Number(row.usage_input), output: Number(row.usage_output) },
    created_at: row.created_at.toISOString(),
  };
}

export function shapeTurn(row: conversations.TurnRow) {
  return {
    id: row.id,
    number: row.number,
    prompt: row.prompt,
    origin: row.origin,
    image_count: row.image_count,
    state: row.state,
    usage: row.usage,
    // Only a failed turn says why; a row written before the column has none.
    error: row.state === 'failed' ? (row.error as TurnError | null) : null,
    reply: row.state === 'running' ? null : row.reply,
    created_at: row.created_at.toISOString(),
    ended_at: row.ended_at?.toISOString() ?? null,
  };
}

/** The wire shape of a log event; `withBlocks` adds the parsed blocks (SPEC `?blocks=true`). */
export function shapeEvent(e: LogEvent, withBlocks = false) {
  const shaped = {
    id: e.id,
    kind: e.kind,
    stream: e.stream,
    data: e.data,
    stage: e.stage,
    state: e.state,
    duration_ms: e.durationMs,
    turn_id: e.turnId,
    ts: e.ts,
  };
  return withBlocks ? { ...shaped, blocks: blocksOf(e) } : shaped;
}

export async function listConversations(
  sql: Sql,
  accountId: string,
  q: {
    roots_only?: string | undefined;
    agent_id?: string | undefined;
    channel_id?: string | undefined;
    status?: string | undefined;
  },
) {
  const statuses = csv(
    q.status,
    CONVERSATION_STATUSES,
    () => new ApiError('invalid_status', `status is one of ${CONVERSATION_STATUSES.join(', ')}.`),
  );
  return conversations.listConversations(sql, accountId, {
    rootsOnly: q.roots_only === 'true',
    agentId: q.agent_id,
    channelId: q.channel_id,
    statuses,
  });
}

export async function getConversation(sql: Sql, accountId: string, id: string) {
  return orNotFound(await conversations.getConversation(sql, accountId, id), 'Conversation');
}

export async function markRead(sql: Sql, who: ActorRef, id: string) {
  orNotFound(await conversations.markRead(sql, who.accountId, id, [changed('conversations')]), 'Conversation');
  return getConversation(sql, who.accountId, id);
}

export async function deleteConversation(sql: Sql, who: ActorRef, id: string) {
  orNotFound(
    await conversations.deleteConversation(sql, who.accountId, id, [changed('conversations')]),
    'Conversation',
  );
  await credentials.revokeSandboxTokens(sql, who.accountId, id);
  await recordAudit(sql, who, 'conversation.deleted', { type: 'conversation', id });
}

export async function listTurns(sql: Sql, accountId: string, id: string) {
  await getConversation(sql, accountId, id);
  return (await conversations.listTurns(sql, accountId, id)).map(shapeTurn);
}

/** An image of a turn by position; 404 when the conversation, the turn or the position does not resolve. */
export async function turnImage(
  sql: Sql,
  accountId: string,
  p: { id: string; turn_id: string; position: number },
): Promise<{ media_type: string; data: Buffer }> {
  return orNotFound(await conversations.turnImage(sql, accountId, p.id, p.turn_id, p.position), 'Image');
}

export async function spawnTree(sql: Sql, accountId: string, id: string) {
  await getConversation(sql, accountId, id);
  return conversations.spawnTree(sql, accountId, id);
}

/**
 * The JSON feed: the conversation's events after `after`, oldest first, optionally only some
 * streams; `meta.next_cursor` is the id to pass as `after` for the next page.
 */
export async function conversationEvents(
  deps: { sql: Sql; log: EventLog },
  accountId: string,
  id: string,
  q: { streams?: string | undefined; after: number; limit: number; blocks?: 'true' | 'false' | undefined },
) {
  await getConversation(deps.sql, accountId, id);
  const streams = csv(
    q.streams,
    LOG_STREAMS,
    () => new ApiError('invalid_request', `streams is a list of ${LOG_STREAMS.join(', ')}.`),
  );
  const wanted: LogEvent[] = [];
  let after = q.after;
  const page = Math.max(q.limit + 1, 200);
  for (;;) {
    const batch = await readLog(deps, accountId, { conversationId: id, after, limit: page });
    for (const e of batch) if (!streams || (streams as string[]).includes(e.stream)) wanted.push(e);
    if (wanted.length > q.limit || batch.length < page) break;
    after = (batch.at(-1) as LogEvent).id;
  }
  const hasMore = wanted.length > q.limit;
  const data = wanted.slice(0, q.limit);
  return {
    data: data.map((e) => shapeEvent(e, q.blocks === 'true')),
    meta: { limit: q.limit, has_more: hasMore, next_cursor: hasMore ? ((data.at(-1) as LogEvent).id ?? null) : null },
  };
}

/** Creates a conversation record (the launch itself comes with the runner fabric). */
export async function createConversationRecord(
  sql: Sql,
  who: ActorRef,
  c: { agentId: string; title?: string; source?: 'ui' | 'agent'; parentId?: string | null; channelId?: string | null },
) {
  const id = newId('cnv');
  await conversations.insertConversation(
    sql,
    {
      id,
      accountId: who.accountId,
      agentId: c.agentId,
      title: c.title ?? '',
      source: c.source ?? 'ui',
      parentId: c.parentId ?? null,
      channelId: c.channelId ?? null,
    },
    [changed('conversations')],
  );
  await recordAudit(sql, who, 'conversation.created', { type: 'conversation', id });
  return getConversation(sql, who.accountId, id);
}
