import { ApiError, blocksOf, CONVERSATION_STATUSES, LOG_STREAMS, newId } from '@svc/core';
import { conversations, credentials, outbox, type Sql, sandboxes } from '@svc/db';
import type { EventLog, LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import { recordAudit } from './audit.ts';
import { endTurnResolvingRequests } from './permissions.ts';
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

/** A comma-separated list of values from `allowed`; anything else is the given error. */
export function csv<T extends string>(
  value: string | undefined,
  allowed: readonly T[],
  error: () => ApiError,
): T[] | undefined {
  if (value === undefined || value.trim() === '') return undefined;
  const items = value.split(',').map((s) => s.trim());
  for (const item of items) if (!(allowed as readonly string[]).includes(item)) throw error();
  return items as T[];
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
  const row = await conversations.getConversation(sql, accountId, id);
  if (!row) throw new ApiError('not_found', 'Conversation not found.');
  return row;
}

export async function markRead(sql: Sql, who: ActorRef, id: string) {
  if (!(await conversations.markRead(sql, who.accountId, id, [changed('conversations')])))
    throw new ApiError('not_found', 'Conversation not found.');
  return getConversation(sql, who.accountId, id);
}

export async function deleteConversation(sql: Sql, who: ActorRef, id: string) {
  if (!(await conversations.deleteConversation(sql, who.accountId, id, [changed('conversations')])))
    throw new ApiError('not_found', 'Conversation not found.');
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
  const image = await conversations.turnImage(sql, accountId, p.id, p.turn_id, p.position);
  if (!image) throw new ApiError('not_found', 'Image not found.');
  return image;
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

/**
 * Ends a running turn with its result and usage; the conversation goes idle, and its watchers
 * hear `conversations` changed; a permission request of the turn still pending is resolved
 * (`turn_end`). False when the turn had already ended (a turn ends once).
 */
export async function finishTurn(
  deps: { sql: Sql; log: EventLog },
  accountId: string,
  turnId: string,
  state: 'done' | 'failed' | 'interrupted' | 'timeout',
  usage: conversations.TurnRow['usage'],
): Promise<boolean> {
  const turn = await conversations.getTurn(deps.sql, accountId, turnId);
  if (turn?.state !== 'running') return false;
  const reply = await replyOf(deps, accountId, turn.conversation_id, turnId);
  const ended = await endTurnResolvingRequests(
    deps.sql,
    accountId,
    turnId,
    state,
    usage,
    [changed('conversations')],
    reply,
  );
  if (ended) await auditTurnEnd(deps.sql, accountId, turnId, state);
  return ended;
}

/** The audit row of a turn's end (actor `system`: the runtime or the service ended it). */
function auditTurnEnd(sql: Sql, accountId: string, turnId: string, state: string, reason?: string) {
  return recordAudit(
    sql,
    { accountId, actor: 'system', ip: null },
    'turn.ended',
    { type: 'turn', id: turnId },
    reason ? { state, reason } : { state },
  );
}

/** How much of a turn's reply is stored (the search index needs no more). */
const REPLY_MAX_CHARS = 200_000;

/**
 * A turn's reply: the text of its agent messages, in order, as the log holds them (redacted).
 * The runner sends a turn's end after everything the turn said, and the fabric ends the record
 * only once what came before the end is appended, so the reply is whole. It reads the
 * conversation's log from the start: fine at turn ends, worth an index on long conversations.
 */
async function replyOf(
  deps: { sql: Sql; log: EventLog },
  accountId: string,
  conversationId: string,
  turnId: string,
): Promise<string> {
  let reply = '';
  let after = 0;
  for (;;) {
    const page = await readLog(deps, accountId, { conversationId, after, limit: 1000 });
    for (const e of page) {
      if (e.turnId !== turnId || e.stream !== 'acp') continue;
      for (const b of blocksOf(e)) if (b.kind === 'text') reply += b.body;
    }
    if (page.length < 1000 || reply.length >= REPLY_MAX_CHARS) break;
    after = (page.at(-1) as LogEvent).id;
  }
  return reply.slice(0, REPLY_MAX_CHARS);
}

/**
 * A runner stayed away past the grace period: each turn still running on its sandboxes ends
 * `failed` with a `turn` stage event saying why (compare-and-set: a turn the runner finished
 * in time is left alone), and its sandboxes are failed. Nothing is left `running`.
 */
export async function failTurnsOfRunner(sql: Sql, runnerId: string): Promise<number> {
  let failed = 0;
  for (const t of await conversations.runningTurnsOnRunner(sql, runnerId)) {
    const ended = await endTurnResolvingRequests(sql, t.account_id, t.turn_id, 'failed', null, [
      {
        conversationId: t.conversation_id,
        turnId: t.turn_id,
        kind: 'stage',
        stream: 'stage',
        stage: 'turn',
        state: 'failed',
        data: JSON.stringify({ usage: null, error: 'the runner went offline and did not come back in time' }),
      },
      changed('conversations'),
    ]);
    if (ended) {
      failed++;
      await auditTurnEnd(sql, t.account_id, t.turn_id, 'failed', 'runner_gone');
    }
    await sandboxes.moveStatus(sql, t.sandbox_id, ['provisioning', 'ready'], 'failed');
  }
  return failed;
}

/**
 * Ends the turns nothing will end any more (`runningTurnsAdrift`): their runner has not been
 * heard from for `graceMs`, as after a restart of the service when the runner did not come
 * back. How each ends is its sandbox provider's (`adrift`: a local runner-agent went with the
 * service, so its turn is `interrupted`; a self-hosted runner that stayed away fails it). Each
 * says why in the log (stage `reattach` failed); compare-and-set, so a turn that ended
 * meanwhile is left alone.
 */
export async function endTurnsAdrift(
  deps: { sql: Sql; providers: SandboxProviders },
  graceMs: number,
): Promise<number> {
  const { sql } = deps;
  const now = Date.now();
  let ended = 0;
  for (const t of await conversations.runningTurnsAdrift(sql, new Date(now - graceMs), new Date(now - 2 * graceMs))) {
    const { state, error, reason } = deps.providers.of(t.provider).adrift;
    const done = await endTurnResolvingRequests(sql, t.account_id, t.turn_id, state, null, [
      { ...stageEvent(t.conversation_id, t.turn_id, 'reattach', 'failed'), data: error },
      { ...stageEvent(t.conversation_id, t.turn_id, 'turn', state), data: JSON.stringify({ usage: null, error }) },
      changed('conversations'),
    ]);
    if (done) {
      ended++;
      await auditTurnEnd(sql, t.account_id, t.turn_id, state, reason);
    }
    await sandboxes.moveStatus(sql, t.sandbox_id, ['provisioning', 'ready'], 'failed');
  }
  return ended;
}

/**
 * A runner connected holding sandboxes: the conversations running a turn on them are
 * reattached (stage `reattach` done), and their turns go on.
 */
export async function reattached(sql: Sql, runnerId: string, sandboxIds: string[]): Promise<void> {
  for (const t of await conversations.runningTurnsOnSandboxes(sql, runnerId, sandboxIds)) {
    await sql.begin((tx) =>
      outbox.enqueue(tx as unknown as Sql, t.account_id, [
        stageEvent(t.conversation_id, t.turn_id, 'reattach', 'done'),
      ]),
    );
  }
}

function stageEvent(conversationId: string, turnId: string, stage: string, state: string) {
  return { conversationId, turnId, kind: 'stage', stream: 'stage', stage, state };
}
