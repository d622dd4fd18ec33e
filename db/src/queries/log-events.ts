import type { LogEvent } from '@svc/core';
import { type Sql, transaction } from '../connect.ts';

/** Rows are LogEvents (core); the name says where they come from. */
export type LogEventRow = LogEvent;

/** How far the tenant's log has been copied (0 when nothing was). */
export async function copiedUpTo(sql: Sql, accountId: string): Promise<number> {
  const rows = await sql<{ copied_id: string }[]>`SELECT copied_id FROM log_copy_marks WHERE account_id = ${accountId}`;
  return rows[0] ? Number(rows[0].copied_id) : 0;
}

/** Tenants that have a copy mark (resumed after a restart). */
export async function tenantsWithMarks(sql: Sql): Promise<string[]> {
  return (await sql<{ account_id: string }[]>`SELECT account_id FROM log_copy_marks`).map((r) => r.account_id);
}

/**
 * Stores a batch and moves the copy mark to its last id, together with the durable mark of
 * every producer in it (the highest number it reached: a producer's numbers rise with the ids,
 * the log accepted them only in order), in one statement of one transaction. Unique on
 * (account, id), so a batch copied twice after a crash is stored once. Returns the producers'
 * marks it wrote.
 *
 * The batch goes as one JSON parameter, unpacked by Postgres: one statement text whatever the
 * batch's size (prepared once), and nothing serialized field by field on the event loop that
 * also delivers the events (a row per event as parameters cost the copier's node more than the
 * copy itself did).
 *
 * Events of a conversation deleted since they were appended are not copied. The statement runs
 * behind the tenant's copy lock, held shared until the copy commits; deleting a conversation
 * takes it exclusively first (deleteConversation). So a delete that commits before the lock is
 * granted is seen by the statement (a new snapshot under READ COMMITTED), and one that comes
 * later waits, then removes what this copy wrote. One lock per batch, taken in the same round
 * trip as the statement: locking each conversation row instead (FOR SHARE) writes every row
 * it locks and was a third of Postgres's CPU per copied event (25 events of 25 conversations
 * a batch: 67 to 81 µs per event, 43 to 46 with this lock).
 */
export async function storeBatch(sql: Sql, accountId: string, events: LogEventRow[]): Promise<Map<string, number>> {
  const marks = new Map<string, number>();
  if (events.length === 0) return marks;
  for (const e of events) marks.set(e.producer, Math.max(marks.get(e.producer) ?? 0, e.seq));
  const last = (events.at(-1) as LogEventRow).id;
  // Placeholders of dropped output are not stored either.
  const store = (t: Sql) => t`
    WITH batch AS (
      SELECT * FROM jsonb_to_recordset(${sql.json(events as never)}) AS e(
        id bigint, "conversationId" text, "turnId" text, kind text, stream text, data text,
        stage text, state text, "durationMs" integer, ts timestamptz, producer text, seq bigint)
    ),
    live AS (
      SELECT id FROM conversations
      WHERE account_id = ${accountId} AND id IN (SELECT "conversationId" FROM batch)
    ),
    stored AS (
      INSERT INTO log_events
        (account_id, id, conversation_id, turn_id, kind, stream, data, stage, state, duration_ms, ts, producer, seq)
      SELECT ${accountId}, id, "conversationId", "turnId", kind, stream, data, stage, state, "durationMs", ts,
        producer, seq
      FROM batch
      WHERE CASE WHEN "conversationId" IS NULL THEN kind <> 'dropped'
            ELSE "conversationId" IN (SELECT id FROM live) END
      ON CONFLICT (account_id, id) DO NOTHING
    ),
    copied AS (
      INSERT INTO log_copy_marks (account_id, copied_id) VALUES (${accountId}, ${last})
      ON CONFLICT (account_id) DO UPDATE SET copied_id = GREATEST(log_copy_marks.copied_id, excluded.copied_id)
    )
    INSERT INTO log_producer_marks (account_id, producer, durable_seq)
    SELECT ${accountId}, producer, max(seq) FROM batch GROUP BY producer
    ON CONFLICT (account_id, producer)
    DO UPDATE SET durable_seq = GREATEST(log_producer_marks.durable_seq, excluded.durable_seq)`;
  // Sent together: Postgres runs them in order, and the statement's snapshot is taken once
  // the lock is granted.
  await transaction(sql, (t) =>
    Promise.all([t`SELECT pg_advisory_xact_lock_shared(hashtextextended(${copyLock(accountId)}, 0))`, store(t)]),
  );
  return marks;
}

/**
 * The tenant's copy lock (storeBatch), an advisory lock on the 64-bit hash of this name. Two
 * tenants whose names hash alike only share a lock, which delays, never breaks.
 */
const copyLock = (accountId: string) => `svc:log-copy:${accountId}`;

/**
 * Waits for the tenant's log copies under way to commit and keeps new ones out until the
 * caller's transaction ends: taken before deleting what a copy could write events for.
 */
export async function lockCopies(tx: Sql, accountId: string): Promise<void> {
  await tx`SELECT pg_advisory_xact_lock(hashtextextended(${copyLock(accountId)}, 0))`;
}

/** The producer's highest durable number, undefined when nothing of it was ever copied. */
export async function durableMark(sql: Sql, accountId: string, producer: string): Promise<number | undefined> {
  const rows = await sql<{ durable_seq: string }[]>`
    SELECT durable_seq FROM log_producer_marks WHERE account_id = ${accountId} AND producer = ${producer}`;
  return rows[0] ? Number(rows[0].durable_seq) : undefined;
}

/** The columns an event has wherever it is stored (the log's copy, the outbox). */
export interface EventColumns {
  conversation_id: string | null;
  turn_id: string | null;
  kind: string;
  stream: string;
  data: string | null;
  stage: string | null;
  state: string | null;
  duration_ms: number | null;
}

/** An event's fields as the log takes them, whichever table they were stored in. */
export type EventFields = ReturnType<typeof eventFields>;

/** Those columns as the event's fields. */
export function eventFields(r: EventColumns) {
  return {
    conversationId: r.conversation_id,
    turnId: r.turn_id,
    kind: r.kind,
    stream: r.stream,
    data: r.data,
    stage: r.stage,
    state: r.state,
    durationMs: r.duration_ms,
  };
}

/** Events after `after` up to `upTo` (inclusive), oldest first. */
export async function readStored(
  sql: Sql,
  accountId: string,
  o: { after: number; upTo: number; limit: number; conversationId?: string | undefined },
): Promise<LogEventRow[]> {
  // ts as ISO 8601 text made by Postgres (what Date#toISOString gives; ts is stored in whole
  // milliseconds): a replay reads many thousands of rows, and parsing each into a Date only to
  // print it again was a good share of its CPU.
  const rows = await sql<(EventColumns & { id: string; ts: string; producer: string | null; seq: string | null })[]>`
    SELECT id, conversation_id, turn_id, kind, stream, data, stage, state, duration_ms,
      to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS ts, producer, seq FROM log_events
    WHERE account_id = ${accountId} AND id > ${o.after} AND id <= ${o.upTo}
      ${o.conversationId ? sql`AND conversation_id = ${o.conversationId}` : sql``}
    ORDER BY id LIMIT ${o.limit}`;
  return rows.map((r) => ({
    id: Number(r.id),
    ...eventFields(r),
    ts: r.ts,
    producer: r.producer ?? '',
    seq: r.seq === null ? 0 : Number(r.seq),
  }));
}
