import type { Sql } from '../connect.ts';

/*
 * Full-text search over a tenant's conversation titles, turn prompts and turn replies
 * (migration 022: stored `simple` tsvectors with GIN indexes). The query text is read by
 * `websearch_to_tsquery`: words, "quoted phrases", `-word` to exclude, `or`.
 */

export type SearchKind = 'title' | 'prompt' | 'reply';

/** What `websearch_to_tsquery` made of a query text. */
export interface ParsedQuery {
  /** False when the text held no word at all (only punctuation, `or`s, quotes): nothing matches. */
  hasWords: boolean;
  /**
   * The words a match holds (lexemes, lower-cased), excluded ones left out. Empty while
   * `hasWords` is true when every word is excluded (`-draft`): such a query cannot use the
   * index and would match nearly everything.
   */
  required: string[];
}

/** Reads `q` as the search will. Any text parses: websearch syntax has no errors. */
export async function parseQuery(sql: Sql, q: string): Promise<ParsedQuery> {
  const [row] = await sql<{ nodes: number; tree: string }[]>`
    SELECT numnode(query) AS nodes, querytree(query) AS tree
    FROM websearch_to_tsquery('simple', ${q}) AS query`;
  const nodes = row?.nodes ?? 0;
  // querytree writes each lexeme quoted, a quote inside doubled; 'T' when nothing is left to index.
  const required = [...(row?.tree ?? '').matchAll(/'((?:[^']|'')*)'/g)].map((m) =>
    (m[1] as string).replace(/''/g, "'"),
  );
  return { hasWords: nodes > 0, required: [...new Set(required)] };
}

export interface SearchFilter {
  kinds: readonly SearchKind[];
  agentId?: string | undefined;
  conversationId?: string | undefined;
  /** Hits whose turn or conversation was created at or after this instant. */
  since?: Date | undefined;
  limit: number;
  offset: number;
}

export interface SearchHitRow {
  kind: SearchKind;
  conversation_id: string;
  agent_id: string;
  turn_id: string | null;
  turn_number: number | null;
  ts: Date;
  /**
   * At most EXCERPT_LENGTH characters of the matched text, starting EXCERPT_BEFORE characters
   * before the first required word it holds (its start when none is found as a whole word).
   */
  excerpt: string;
  /** Whether the text goes on before the excerpt, and after it. */
  cut_before: boolean;
  cut_after: boolean;
}

/** Characters of context kept before the first matched word, and the excerpt's whole length. */
export const EXCERPT_BEFORE = 80;
export const EXCERPT_LENGTH = 240;

/** A Postgres regular expression (ARE) matching any of `words` as a whole word, any case. */
function wholeWords(words: readonly string[]): string {
  // In an ARE a backslash before a character that is neither letter nor digit stands for it.
  const escaped = words.map((w) => w.replace(/[^\p{L}\p{N}\s]/gu, (c) => `\\${c}`));
  return `\\m(?:${escaped.join('|')})\\M`;
}

/**
 * One page of hits for the tenant, best first: by `ts_rank`, then newest, then a fixed order
 * of kind, conversation and turn so pages never overlap. `limit + 1` rows are read so the
 * caller can tell whether more exist. Every source is filtered on `accountId`; a reply counts
 * only once its turn has ended. The matched texts are read for the page's rows only, and
 * only the excerpt of each leaves the database. `required` is ParsedQuery's and not empty.
 */
export async function searchHits(
  sql: Sql,
  accountId: string,
  q: string,
  required: readonly string[],
  f: SearchFilter,
): Promise<SearchHitRow[]> {
  // Written out in each source rather than joined from a CTE, so the planner sees a constant.
  const query = sql`websearch_to_tsquery('simple', ${q})`;
  const sources = [];
  if (f.kinds.includes('title')) {
    sources.push(sql`
      SELECT 'title' AS kind, c.id AS conversation_id, c.agent_id, NULL::text AS turn_id, NULL::int AS turn_number,
             c.created_at AS ts, ts_rank(c.title_tsv, ${query}) AS rank
      FROM conversations c
      WHERE c.account_id = ${accountId} AND c.title_tsv @@ ${query}
        ${f.agentId === undefined ? sql`` : sql`AND c.agent_id = ${f.agentId}`}
        ${f.conversationId === undefined ? sql`` : sql`AND c.id = ${f.conversationId}`}
        ${f.since === undefined ? sql`` : sql`AND c.created_at >= ${f.since}`}`);
  }
  for (const kind of ['prompt', 'reply'] as const) {
    if (!f.kinds.includes(kind)) continue;
    const vector = kind === 'prompt' ? sql`prompt_tsv` : sql`reply_tsv`;
    // The turns that match, found in one scan (OFFSET 0 keeps the planner from repeating the
    // index scan once per conversation of an agent), then joined to their conversations.
    sources.push(sql`
      SELECT ${kind === 'prompt' ? sql`'prompt'` : sql`'reply'`} AS kind, t.conversation_id, c.agent_id,
             t.id AS turn_id, t.number AS turn_number, t.created_at AS ts, t.rank
      FROM (
        SELECT id, conversation_id, number, created_at, ts_rank(${vector}, ${query}) AS rank
        FROM turns
        WHERE account_id = ${accountId} AND ${vector} @@ ${query}
          ${kind === 'reply' ? sql`AND state <> 'running'` : sql``}
          ${f.conversationId === undefined ? sql`` : sql`AND conversation_id = ${f.conversationId}`}
          ${f.since === undefined ? sql`` : sql`AND created_at >= ${f.since}`}
        OFFSET 0
      ) t
      JOIN conversations c ON c.account_id = ${accountId} AND c.id = t.conversation_id
        ${f.agentId === undefined ? sql`` : sql`AND c.agent_id = ${f.agentId}`}`);
  }
  if (sources.length === 0) return [];
  const union = sources.reduce((all, source) => sql`${all} UNION ALL ${source}`);
  const order = sql`rank DESC, ts DESC, kind, conversation_id, turn_number`;
  return sql<SearchHitRow[]>`
    WITH page AS (SELECT * FROM (${union}) hits ORDER BY ${order} LIMIT ${f.limit + 1} OFFSET ${f.offset}),
    -- The matched text of each hit on the page (one primary-key probe), and where its excerpt
    -- starts. OFFSET 0 keeps each subquery whole, so both are computed once per hit.
    texts AS (
      SELECT page.*, b.body
      FROM page CROSS JOIN LATERAL (
        SELECT CASE page.kind
                 WHEN 'title' THEN (SELECT title FROM conversations WHERE account_id = ${accountId} AND id = page.conversation_id)
                 WHEN 'prompt' THEN (SELECT prompt FROM turns WHERE account_id = ${accountId} AND id = page.turn_id)
                 ELSE (SELECT reply FROM turns WHERE account_id = ${accountId} AND id = page.turn_id)
               END AS body
        OFFSET 0
      ) b
    ),
    windows AS (
      SELECT texts.*,
             greatest(1, coalesce(nullif(regexp_instr(body, ${wholeWords(required)}, 1, 1, 0, 'i'), 0),
                                  nullif(strpos(lower(body), ${required[0] ?? ''}), 0), 1) - ${EXCERPT_BEFORE}) AS start
      FROM texts OFFSET 0
    )
    SELECT kind, conversation_id, agent_id, turn_id, turn_number, ts,
           substr(body, start, ${EXCERPT_LENGTH}) AS excerpt,
           start > 1 AS cut_before,
           start + ${EXCERPT_LENGTH} <= length(body) AS cut_after
    FROM windows
    ORDER BY ${order}`;
}

/** The migration that began storing a turn's reply at its end. */
const REPLY_MIGRATION = '013_turn_reply.sql';

/**
 * Up to `limit` ended turns with no stored reply that ended before replies were stored
 * (before migration 013 was applied), by id after `afterId`: what the reply backfill fills
 * in. A turn that ended later without a reply (it failed before it ran) is not one of them.
 */
export async function turnsWithoutStoredReply(
  sql: Sql,
  afterId: string,
  limit: number,
): Promise<{ id: string; account_id: string; conversation_id: string }[]> {
  return sql`
    SELECT id, account_id, conversation_id FROM turns
    WHERE reply IS NULL AND state <> 'running' AND id > ${afterId}
      AND (ended_at IS NULL OR ended_at < (SELECT applied_at FROM schema_migrations WHERE name = ${REPLY_MIGRATION}))
    ORDER BY id
    LIMIT ${limit}`;
}

/** Stores a backfilled reply, only where none is stored yet: a repeat or a race changes nothing. */
export async function storeMissingReply(sql: Sql, accountId: string, turnId: string, reply: string): Promise<boolean> {
  const rows = await sql`
    UPDATE turns SET reply = ${reply}
    WHERE account_id = ${accountId} AND id = ${turnId} AND reply IS NULL AND state <> 'running'
    RETURNING id`;
  return rows.length === 1;
}
