import type postgres from 'postgres';
import { type Sql, transaction } from '../connect.ts';
import { lockCopies } from './log-events.ts';
import { enqueue, type OutboxEvent } from './outbox.ts';

export interface ConversationRow {
  id: string;
  agent_id: string;
  title: string;
  status: 'idle' | 'running' | 'terminated';
  source: 'ui' | 'agent';
  parent_id: string | null;
  sandbox_id: string | null;
  channel_id: string | null;
  environment_id: string | null;
  vault_id: string | null;
  last_active_at: Date;
  last_read_at: Date | null;
  created_at: Date;
  updated_at: Date;
  turn_count: number;
  usage_input: string;
  usage_output: string;
}

export interface TurnRow {
  id: string;
  conversation_id: string;
  number: number;
  prompt: string;
  origin: 'user' | 'autonomous';
  image_count: number;
  state: 'running' | 'done' | 'failed' | 'interrupted' | 'timeout';
  usage: { input: number; output: number; cache_read?: number; cache_write?: number } | null;
  /** The agent's messages joined, stored when the turn ended. */
  reply: string | null;
  /** Why a failed turn failed (`{code, message}`); null otherwise. */
  error: { code: string; message: string } | null;
  created_at: Date;
  ended_at: Date | null;
}

/*
 * The columns the rows above read, named rather than `*`: both tables also hold search vectors
 * (migration 022), which no reader of a turn or conversation needs and which are as large as
 * the text they index. `satisfies Record<keyof Row, true>` fails the typecheck when a row type
 * gains a field these lists lack.
 */
const TURN_COLUMNS = Object.keys({
  id: true,
  conversation_id: true,
  number: true,
  prompt: true,
  origin: true,
  image_count: true,
  state: true,
  usage: true,
  reply: true,
  error: true,
  created_at: true,
  ended_at: true,
} satisfies Record<keyof TurnRow, true>);

const CONVERSATION_COLUMNS = Object.keys({
  id: true,
  agent_id: true,
  title: true,
  status: true,
  source: true,
  parent_id: true,
  sandbox_id: true,
  channel_id: true,
  environment_id: true,
  vault_id: true,
  last_active_at: true,
  last_read_at: true,
  created_at: true,
  updated_at: true,
} satisfies Record<Exclude<keyof ConversationRow, 'turn_count' | 'usage_input' | 'usage_output'>, true>).map(
  (name) => `c.${name}`,
);

function selectConversations(sql: Sql) {
  return sql`
    SELECT ${sql(CONVERSATION_COLUMNS)},
      (SELECT count(*)::int FROM turns t WHERE t.conversation_id = c.id) AS turn_count,
      (SELECT coalesce(sum((t.usage->>'input')::bigint), 0)::text FROM turns t WHERE t.conversation_id = c.id) AS usage_input,
      (SELECT coalesce(sum((t.usage->>'output')::bigint), 0)::text FROM turns t WHERE t.conversation_id = c.id) AS usage_output
    FROM conversations c`;
}

export interface ConversationFilter {
  rootsOnly?: boolean;
  agentId?: string | undefined;
  channelId?: string | undefined;
  statuses?: string[] | undefined;
}

export async function listConversations(
  sql: Sql,
  accountId: string,
  f: ConversationFilter,
): Promise<ConversationRow[]> {
  return sql<ConversationRow[]>`
    ${selectConversations(sql)}
    WHERE c.account_id = ${accountId}
      ${f.rootsOnly ? sql`AND c.parent_id IS NULL` : sql``}
      ${f.agentId ? sql`AND c.agent_id = ${f.agentId}` : sql``}
      ${f.channelId ? sql`AND c.channel_id = ${f.channelId}` : sql``}
      ${f.statuses?.length ? sql`AND c.status = ANY(${f.statuses})` : sql``}
    ORDER BY c.last_active_at DESC, c.id DESC`;
}

export async function getConversation(sql: Sql, accountId: string, id: string): Promise<ConversationRow | undefined> {
  const rows = await sql<
    ConversationRow[]
  >`${selectConversations(sql)} WHERE c.account_id = ${accountId} AND c.id = ${id}`;
  return rows[0];
}

/** The given conversations of the tenant (missing ids are absent), in one query. */
export async function conversationsByIds(sql: Sql, accountId: string, ids: string[]): Promise<ConversationRow[]> {
  if (ids.length === 0) return [];
  return sql<ConversationRow[]>`${selectConversations(sql)} WHERE c.account_id = ${accountId} AND c.id = ANY(${ids})`;
}

/** The agent's conversations on a channel, newest first (by creation). */
export async function onChannel(
  sql: Sql,
  accountId: string,
  agentId: string,
  channelId: string,
): Promise<ConversationRow[]> {
  return sql<ConversationRow[]>`
    ${selectConversations(sql)}
    WHERE c.account_id = ${accountId} AND c.agent_id = ${agentId} AND c.channel_id = ${channelId}
    ORDER BY c.created_at DESC, c.id DESC`;
}

/**
 * The state changes below take the events they cause (`events`) and write them into the
 * outbox in the same transaction: a change and its events commit together or not at all.
 */
export async function insertConversation(
  sql: Sql,
  c: {
    id: string;
    accountId: string;
    agentId: string;
    title: string;
    source: 'ui' | 'agent';
    parentId?: string | null;
    channelId?: string | null;
    environmentId?: string | null;
    vaultId?: string | null;
  },
  events: OutboxEvent[] = [],
): Promise<void> {
  await transaction(sql, async (t) => {
    await t`INSERT INTO conversations (id, account_id, agent_id, title, source, parent_id, channel_id, environment_id, vault_id)
            VALUES (${c.id}, ${c.accountId}, ${c.agentId}, ${c.title}, ${c.source}, ${c.parentId ?? null},
                    ${c.channelId ?? null}, ${c.environmentId ?? null}, ${c.vaultId ?? null})`;
    await enqueue(t, c.accountId, events);
  });
}

export async function markRead(sql: Sql, accountId: string, id: string, events: OutboxEvent[] = []): Promise<boolean> {
  return transaction(sql, async (t) => {
    const rows =
      await t`UPDATE conversations SET last_read_at = now() WHERE account_id = ${accountId} AND id = ${id} RETURNING id`;
    if (rows.length === 1) await enqueue(t, accountId, events);
    return rows.length === 1;
  });
}

export async function deleteConversation(
  sql: Sql,
  accountId: string,
  id: string,
  events: OutboxEvent[] = [],
): Promise<boolean> {
  return transaction(sql, async (t) => {
    // A copy of the log under way may be writing this conversation's events: it commits
    // first, and these deletes see what it wrote (log-events.ts, storeBatch).
    await lockCopies(t, accountId);
    const rows = await t`DELETE FROM conversations WHERE account_id = ${accountId} AND id = ${id} RETURNING id`;
    if (rows.length) {
      await t`DELETE FROM log_events WHERE account_id = ${accountId} AND conversation_id = ${id}`;
      await enqueue(t, accountId, events);
    }
    return rows.length === 1;
  });
}

/** Every conversation connected to `id` through parent links, ancestors and descendants. */
export async function spawnTree(sql: Sql, accountId: string, id: string) {
  return sql<{ id: string; source: string; status: string; parent_id: string | null }[]>`
    WITH RECURSIVE up AS (
      SELECT id, parent_id FROM conversations WHERE account_id = ${accountId} AND id = ${id}
      UNION SELECT c.id, c.parent_id FROM conversations c JOIN up ON c.id = up.parent_id WHERE c.account_id = ${accountId}
    ), root AS (SELECT id FROM up WHERE parent_id IS NULL LIMIT 1),
    down AS (
      SELECT c.id FROM conversations c WHERE c.account_id = ${accountId} AND c.id = coalesce((SELECT id FROM root), ${id})
      UNION SELECT c.id FROM conversations c JOIN down ON c.parent_id = down.id WHERE c.account_id = ${accountId}
    )
    SELECT c.id, c.source, c.status, c.parent_id FROM conversations c JOIN down USING (id) ORDER BY c.created_at, c.id`;
}

export async function listTurns(sql: Sql, accountId: string, conversationId: string): Promise<TurnRow[]> {
  return sql<
    TurnRow[]
  >`SELECT ${sql(TURN_COLUMNS)} FROM turns WHERE account_id = ${accountId} AND conversation_id = ${conversationId} ORDER BY number`;
}

/**
 * Why a turn could not open: the conversation runs one already (`busy`), has ended
 * (`terminated`), its single-turn sandbox runs another conversation's turn (`at_capacity`), or
 * it does not exist (`missing`).
 */
export type TurnRefusal = 'busy' | 'terminated' | 'at_capacity' | 'missing';

/**
 * Opens the next turn when the conversation is idle (compare-and-set: of two prompts racing,
 * one opens a turn and the other is refused); the conversation becomes running and active now.
 * With `oneTurnPerSandbox` (opencode and gemini sandboxes) the sandbox row is locked and the
 * turn is refused while another conversation on it runs one.
 */
export async function startTurn(
  sql: Sql,
  t: {
    id: string;
    accountId: string;
    conversationId: string;
    prompt: string;
    origin: 'user' | 'autonomous';
    images?: { mediaType: string; data: Buffer }[];
    oneTurnPerSandbox?: boolean;
  },
  events: OutboxEvent[] = [],
): Promise<TurnRow | TurnRefusal> {
  return transaction(sql, async (s) => {
    if (t.oneTurnPerSandbox) {
      // The lock makes two conversations' prompts on one sandbox take turns at this check.
      const sandbox = await s<{ id: string }[]>`
        SELECT id FROM sandboxes
        WHERE id = (SELECT sandbox_id FROM conversations WHERE account_id = ${t.accountId} AND id = ${t.conversationId})
        FOR UPDATE`;
      const busy = sandbox[0]
        ? await s`SELECT 1 FROM conversations c JOIN turns tr ON tr.conversation_id = c.id
                  WHERE c.sandbox_id = ${sandbox[0].id} AND c.id <> ${t.conversationId} AND tr.state = 'running' LIMIT 1`
        : [];
      if (busy.length) return 'at_capacity';
    }
    const moved = await s`UPDATE conversations SET status = 'running', last_active_at = now(), updated_at = now()
                          WHERE account_id = ${t.accountId} AND id = ${t.conversationId} AND status = 'idle'
                          RETURNING id`;
    if (moved.length === 0) {
      const rows = await s<{ status: string }[]>`
        SELECT status FROM conversations WHERE account_id = ${t.accountId} AND id = ${t.conversationId}`;
      const status = rows[0]?.status;
      return status === undefined ? 'missing' : status === 'terminated' ? 'terminated' : 'busy';
    }
    const images = t.images ?? [];
    const rows = await s<TurnRow[]>`
      INSERT INTO turns (id, account_id, conversation_id, number, prompt, origin, image_count)
      VALUES (${t.id}, ${t.accountId}, ${t.conversationId},
              (SELECT coalesce(max(number), 0) + 1 FROM turns WHERE conversation_id = ${t.conversationId}),
              ${t.prompt}, ${t.origin}, ${images.length})
      RETURNING ${s(TURN_COLUMNS)}`;
    for (const [position, image] of images.entries()) {
      await s`INSERT INTO turn_images (account_id, turn_id, position, media_type, data)
              VALUES (${t.accountId}, ${t.id}, ${position}, ${image.mediaType}, ${image.data})`;
    }
    await enqueue(s, t.accountId, events);
    return rows[0] as TurnRow;
  });
}

/** One stored image of a turn of the conversation, by position (undefined when any part does not resolve). */
export async function turnImage(
  sql: Sql,
  accountId: string,
  conversationId: string,
  turnId: string,
  position: number,
): Promise<{ media_type: string; data: Buffer } | undefined> {
  const rows = await sql<{ media_type: string; data: Buffer }[]>`
    SELECT i.media_type, i.data FROM turn_images i JOIN turns t ON t.id = i.turn_id
    WHERE i.account_id = ${accountId} AND t.account_id = ${accountId} AND t.conversation_id = ${conversationId}
      AND i.turn_id = ${turnId} AND i.position = ${position}`;
  return rows[0];
}

/** A turn by id, with its conversation. */
export async function getTurn(sql: Sql, accountId: string, turnId: string): Promise<TurnRow | undefined> {
  const rows = await sql<
    TurnRow[]
  >`SELECT ${sql(TURN_COLUMNS)} FROM turns WHERE account_id = ${accountId} AND id = ${turnId}`;
  return rows[0];
}

/** The running turn of a conversation, if one runs. */
export async function runningTurn(sql: Sql, accountId: string, conversationId: string): Promise<TurnRow | undefined> {
  const rows = await sql<TurnRow[]>`
    SELECT ${sql(TURN_COLUMNS)} FROM turns WHERE account_id = ${accountId} AND conversation_id = ${conversationId} AND state = 'running'`;
  return rows[0];
}

/**
 * Ends the conversation (compare-and-set: once). A turn still running ends `interrupted`.
 * Resolves to what the caller must clean up, or undefined when it was already terminated or
 * does not exist. `othersOnSandbox` counts the sandbox's other conversations still live.
 */
export async function terminate(
  sql: Sql,
  accountId: string,
  id: string,
  events: (interruptedTurnId: string | null) => OutboxEvent[],
): Promise<{ sandboxId: string | null; interruptedTurnId: string | null; othersOnSandbox: number } | undefined> {
  return transaction(sql, async (s) => {
    const rows = await s<{ sandbox_id: string | null }[]>`
      UPDATE conversations SET status = 'terminated', last_active_at = now(), updated_at = now()
      WHERE account_id = ${accountId} AND id = ${id} AND status <> 'terminated' RETURNING sandbox_id`;
    const row = rows[0];
    if (!row) return undefined;
    const turns = await s<{ id: string }[]>`
      UPDATE turns SET state = 'interrupted', ended_at = now()
      WHERE account_id = ${accountId} AND conversation_id = ${id} AND state = 'running' RETURNING id`;
    const interruptedTurnId = turns[0]?.id ?? null;
    const others = row.sandbox_id
      ? await s<{ n: number }[]>`
          SELECT count(*)::int AS n FROM conversations
          WHERE account_id = ${accountId} AND sandbox_id = ${row.sandbox_id} AND id <> ${id} AND status <> 'terminated'`
      : [{ n: 0 }];
    await enqueue(s, accountId, events(interruptedTurnId));
    return { sandboxId: row.sandbox_id, interruptedTurnId, othersOnSandbox: others[0]?.n ?? 0 };
  });
}

/**
 * Ends a running turn (compare-and-set on state: a turn ends once); the conversation goes
 * idle and active now. `usage` is the figure the runtime reported once, or null; `error` why
 * a failed turn failed, or null.
 */
export async function endTurn(
  sql: Sql,
  accountId: string,
  turnId: string,
  state: 'done' | 'failed' | 'interrupted' | 'timeout',
  usage: TurnRow['usage'],
  events: OutboxEvent[] = [],
  reply: string | null = null,
  error: TurnRow['error'] = null,
): Promise<boolean> {
  return transaction(sql, async (s) => {
    const rows = await s<{ conversation_id: string }[]>`
      UPDATE turns SET state = ${state}, usage = ${usage === null ? null : s.json(usage as postgres.JSONValue)},
                       reply = ${reply}, error = ${error === null ? null : s.json(error)}, ended_at = now()
      WHERE account_id = ${accountId} AND id = ${turnId} AND state = 'running' RETURNING conversation_id`;
    const conversationId = rows[0]?.conversation_id;
    if (!conversationId) return false;
    await s`UPDATE conversations SET status = 'idle', last_active_at = now(), updated_at = now()
            WHERE account_id = ${accountId} AND id = ${conversationId} AND status = 'running'`;
    await enqueue(s, accountId, events);
    return true;
  });
}

/** Agent and channel of the given conversations of the tenant (missing ids are absent). */
export async function lookup(
  sql: Sql,
  accountId: string,
  ids: string[],
): Promise<{ id: string; agent_id: string; channel_id: string | null }[]> {
  if (ids.length === 0) return [];
  return sql`SELECT id, agent_id, channel_id FROM conversations WHERE account_id = ${accountId} AND id = ANY(${ids})`;
}

/** Puts the conversation on a sandbox. */
export async function setSandbox(sql: Sql, accountId: string, id: string, sandboxId: string): Promise<void> {
  await sql`UPDATE conversations SET sandbox_id = ${sandboxId}, updated_at = now() WHERE account_id = ${accountId} AND id = ${id}`;
}

/** Turns still running on sandboxes of a runner (to fail them when the runner is gone). */
export async function runningTurnsOnRunner(
  sql: Sql,
  runnerId: string,
): Promise<{ account_id: string; turn_id: string; conversation_id: string; sandbox_id: string }[]> {
  return sql`
    SELECT t.account_id, t.id AS turn_id, t.conversation_id, c.sandbox_id
    FROM turns t JOIN conversations c ON c.id = t.conversation_id JOIN sandboxes s ON s.id = c.sandbox_id
    WHERE s.runner_id = ${runnerId} AND t.state = 'running'`;
}

/**
 * Running turns whose sandbox's runner has not been heard from since `heardBefore` (or that
 * has no runner any more), among turns opened before `openedBefore`: after a restart of the
 * service, or a runner that never came back, nothing else would end them. `starting`: the
 * sandbox is provisioning and has no runner yet (its provider may still be starting one).
 * Also those whose sandbox has been `suspended` or `failed` since before `heardBefore` while
 * its runner is heard from (`restarted`): the runner came back without the machine (killed,
 * then started again), and the output it resent after its reconnection did not end the turn.
 */
export async function runningTurnsAdrift(
  sql: Sql,
  heardBefore: Date,
  openedBefore: Date,
): Promise<
  {
    account_id: string;
    turn_id: string;
    conversation_id: string;
    sandbox_id: string;
    provider: string;
    opened_at: Date;
    starting: boolean;
    restarted: boolean;
  }[]
> {
  return sql`
    SELECT account_id, turn_id, conversation_id, sandbox_id, provider, opened_at, starting,
      NOT away AS restarted
    FROM (
      SELECT t.account_id, t.id AS turn_id, t.conversation_id, c.sandbox_id, s.provider,
        t.created_at AS opened_at, (s.status = 'provisioning' AND r.id IS NULL) AS starting,
        (r.id IS NULL OR r.last_seen_at IS NULL OR r.last_seen_at < ${heardBefore}) AS away,
        (s.status IN ('suspended', 'failed') AND s.updated_at < ${heardBefore}) AS machine_gone
      FROM turns t JOIN conversations c ON c.id = t.conversation_id JOIN sandboxes s ON s.id = c.sandbox_id
      LEFT JOIN runners r ON r.id = s.runner_id
      WHERE t.state = 'running' AND t.created_at < ${openedBefore}
    ) running
    WHERE away OR machine_gone`;
}

/** Running turns on the runner's given sandboxes (it reconnected holding them). */
export async function runningTurnsOnSandboxes(
  sql: Sql,
  runnerId: string,
  sandboxIds: string[],
): Promise<{ account_id: string; turn_id: string; conversation_id: string }[]> {
  if (sandboxIds.length === 0) return [];
  return sql`
    SELECT t.account_id, t.id AS turn_id, t.conversation_id
    FROM turns t JOIN conversations c ON c.id = t.conversation_id JOIN sandboxes s ON s.id = c.sandbox_id
    WHERE s.runner_id = ${runnerId} AND s.id = ANY(${sandboxIds}) AND t.state = 'running'`;
}

/** Whether the tenant has the conversation (a deleted one is gone). */
export async function exists(sql: Sql, accountId: string, id: string): Promise<boolean> {
  const rows = await sql`SELECT 1 FROM conversations WHERE account_id = ${accountId} AND id = ${id}`;
  return rows.length === 1;
}
