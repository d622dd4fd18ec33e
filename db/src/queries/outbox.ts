import type { NewEvent } from '@svc/core';
import type { Sql } from '../connect.ts';
import { type EventColumns, type EventFields, eventFields } from './log-events.ts';

/** An event the service emits, as written beside the state change that causes it. */
export type OutboxEvent = NewEvent;

/** An outbox row: its number in the tenant's outbox and the event it holds. */
export interface OutboxRow extends EventFields {
  seq: number;
}

/** The producer name the relay appends the outbox under. */
export const OUTBOX_PRODUCER = 'outbox';

/** The Postgres channel told (on commit) that a tenant's outbox has rows. */
export const OUTBOX_CHANNEL = 'svc_outbox';

/**
 * Writes events into the tenant's outbox. Call it inside the transaction of the state change:
 * the events commit with it or not at all. Numbers come from the tenant's counter row, which
 * this transaction holds locked until it ends, so the tenant's numbers commit in order and
 * without holes (a relay reading them in order never skips one that commits later).
 */
export async function enqueue(tx: Sql, accountId: string, events: OutboxEvent[]): Promise<void> {
  if (events.length === 0) return;
  const [counter] = await tx<{ last_seq: string }[]>`
    INSERT INTO log_outbox_counters (account_id, last_seq) VALUES (${accountId}, ${events.length})
    ON CONFLICT (account_id) DO UPDATE SET last_seq = log_outbox_counters.last_seq + ${events.length}
    RETURNING last_seq`;
  const first = Number((counter as { last_seq: string }).last_seq) - events.length + 1;
  const rows = events.map((e, i) => ({
    account_id: accountId,
    seq: first + i,
    conversation_id: e.conversationId,
    turn_id: e.turnId ?? null,
    kind: e.kind,
    stream: e.stream,
    data: e.data ?? null,
    stage: e.stage ?? null,
    state: e.state ?? null,
    duration_ms: e.durationMs ?? null,
  }));
  await tx`INSERT INTO log_outbox ${tx(rows)}`;
  await tx`SELECT pg_notify(${OUTBOX_CHANNEL}, ${accountId})`;
}

/** Tenants with rows in their outbox. */
export async function tenantsWithRows(sql: Sql): Promise<string[]> {
  return (await sql<{ account_id: string }[]>`SELECT DISTINCT account_id FROM log_outbox`).map((r) => r.account_id);
}

/** The tenant's outbox rows after `after`, in order. */
export async function rowsAfter(sql: Sql, accountId: string, after: number, limit: number): Promise<OutboxRow[]> {
  const rows = await sql<(EventColumns & { seq: string })[]>`
    SELECT seq, conversation_id, turn_id, kind, stream, data, stage, state, duration_ms FROM log_outbox
    WHERE account_id = ${accountId} AND seq > ${after} ORDER BY seq LIMIT ${limit}`;
  return rows.map((r) => ({ seq: Number(r.seq), ...eventFields(r) }));
}

/** Drops the rows the log holds durably (the producer may forget them). */
export async function forget(sql: Sql, accountId: string, upTo: number): Promise<void> {
  await sql`DELETE FROM log_outbox WHERE account_id = ${accountId} AND seq <= ${upTo}`;
}
