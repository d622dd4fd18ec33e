import type { Sql } from '../connect.ts';

export type ExportStatus = 'pending' | 'ready' | 'failed';

export interface ExportRow {
  id: string;
  account_id: string;
  status: ExportStatus;
  events_written: number;
  bytes: number | null;
  attempts: number;
  claimed_until: Date | null;
  error: string | null;
  created_at: Date;
  completed_at: Date | null;
}

const columns = (sql: Sql) => sql`id, account_id, status, events_written::float8 AS events_written,
  bytes::float8 AS bytes, attempts, claimed_until, error, created_at, completed_at`;

/**
 * Starts a pending export for the account, unless one is already pending (the partial unique
 * index decides between two racing requests): undefined then.
 */
export async function insertPending(sql: Sql, id: string, accountId: string): Promise<ExportRow | undefined> {
  const rows = await sql<ExportRow[]>`
    INSERT INTO exports (id, account_id) VALUES (${id}, ${accountId})
    ON CONFLICT (account_id) WHERE status = 'pending' DO NOTHING
    RETURNING ${columns(sql)}`;
  return rows[0];
}

/** The account's newest export (ids sort by creation time), or undefined. */
export async function latest(sql: Sql, accountId: string): Promise<ExportRow | undefined> {
  const rows = await sql<ExportRow[]>`
    SELECT ${columns(sql)} FROM exports WHERE account_id = ${accountId} ORDER BY id DESC LIMIT 1`;
  return rows[0];
}

/** The account's export `id`; another account's reads as missing. */
export async function getExport(sql: Sql, accountId: string, id: string): Promise<ExportRow | undefined> {
  const rows = await sql<ExportRow[]>`
    SELECT ${columns(sql)} FROM exports WHERE account_id = ${accountId} AND id = ${id}`;
  return rows[0];
}

/**
 * Claims the oldest pending export that no live lease holds, for `leaseUntil`, counting the
 * attempt; the returned `attempts` is the claim's number, which every later write of this
 * claim names. Rows another transaction is claiming are skipped (`FOR UPDATE SKIP LOCKED`);
 * a lease that expired (its worker died) is claimed again.
 */
export async function claimPending(sql: Sql, now: Date, leaseUntil: Date): Promise<ExportRow | undefined> {
  const rows = await sql<ExportRow[]>`
    UPDATE exports SET claimed_until = ${leaseUntil}, attempts = attempts + 1, events_written = 0, updated_at = now()
    WHERE id = (
      SELECT id FROM exports
      WHERE status = 'pending' AND (claimed_until IS NULL OR claimed_until <= ${now})
      ORDER BY id LIMIT 1
      FOR UPDATE SKIP LOCKED)
    RETURNING ${columns(sql)}`;
  return rows[0];
}

/**
 * Records progress under claim `attempt` and extends its lease; false when the claim is no
 * longer this one's (its lease passed to another worker, or the export or account is gone).
 */
export async function recordProgress(
  sql: Sql,
  id: string,
  attempt: number,
  eventsWritten: number,
  leaseUntil: Date,
): Promise<boolean> {
  const rows = await sql`
    UPDATE exports SET events_written = ${eventsWritten}, claimed_until = ${leaseUntil}, updated_at = now()
    WHERE id = ${id} AND attempts = ${attempt} AND status = 'pending'
    RETURNING id`;
  return rows.length === 1;
}

/**
 * Marks export `id` ready under claim `attempt` and deletes the account's older exports in
 * the same transaction; resolves to those older ids (their files are the caller's to remove),
 * or undefined when the claim is no longer this one's and nothing changed.
 */
export async function markReady(
  sql: Sql,
  id: string,
  attempt: number,
  done: { eventsWritten: number; bytes: number; at: Date },
): Promise<string[] | undefined> {
  return sql.begin(async (tx) => {
    const rows = await tx<{ account_id: string }[]>`
      UPDATE exports SET status = 'ready', events_written = ${done.eventsWritten}, bytes = ${done.bytes},
        completed_at = ${done.at}, claimed_until = NULL, error = NULL, updated_at = now()
      WHERE id = ${id} AND attempts = ${attempt} AND status = 'pending'
      RETURNING account_id`;
    const row = rows[0];
    if (!row) return undefined;
    const older = await tx<{ id: string }[]>`
      DELETE FROM exports WHERE account_id = ${row.account_id} AND id < ${id} RETURNING id`;
    return older.map((r) => r.id);
  });
}

/**
 * A build under claim `attempt` failed with `error`: the claim is released so the next pass
 * tries again, or, with `final`, the export ends `failed`.
 */
export async function recordFailure(sql: Sql, id: string, attempt: number, error: string, final: boolean) {
  await sql`
    UPDATE exports SET error = ${error}, claimed_until = NULL, updated_at = now(),
      ${final ? sql`status = 'failed'` : sql`status = status`}
    WHERE id = ${id} AND attempts = ${attempt} AND status = 'pending'`;
}

/** Whether export `id` still exists (its account may have been deleted meanwhile). */
export async function exists(sql: Sql, id: string): Promise<boolean> {
  const rows = await sql`SELECT 1 FROM exports WHERE id = ${id}`;
  return rows.length === 1;
}

/**
 * What an export holds of each table: the key it pages on (and that key's SQL type) and the
 * columns it leaves out. Secret values live only in `ciphertext`/`secret_ciphertext` columns
 * (tables of inference credentials, keys, sessions and tokens are not exported at all); search
 * vectors and worker claims are internal.
 */
export const EXPORT_SECTIONS = {
  agents: { table: 'agents', key: 'id', keyType: 'text', omit: [] },
  environments: { table: 'environments', key: 'id', keyType: 'text', omit: [] },
  environment_secrets: { table: 'environment_secrets', key: 'id', keyType: 'text', omit: ['ciphertext'] },
  vaults: { table: 'vaults', key: 'id', keyType: 'text', omit: [] },
  vault_secrets: { table: 'vault_secrets', key: 'id', keyType: 'text', omit: ['ciphertext'] },
  conversations: { table: 'conversations', key: 'id', keyType: 'text', omit: ['title_tsv'] },
  turns: { table: 'turns', key: 'id', keyType: 'text', omit: ['prompt_tsv', 'reply_tsv'] },
  schedules: {
    table: 'schedules',
    key: 'id',
    keyType: 'text',
    omit: ['claimed_until', 'claim_conversation_id'],
  },
  teammates: { table: 'teammates', key: 'agent_id', keyType: 'text', omit: [] },
  webhooks: { table: 'webhook_endpoints', key: 'id', keyType: 'text', omit: ['secret_ciphertext'] },
  audit: { table: 'audit_events', key: 'id', keyType: 'bigint', omit: [] },
  credit_ledger: { table: 'credit_ledger', key: 'id', keyType: 'bigint', omit: [] },
  support_reports: {
    table: 'support_reports',
    key: 'id',
    keyType: 'text',
    omit: ['screenshot', 'attempts', 'next_attempt_at', 'claimed_until'],
  },
} as const satisfies Record<string, { table: string; key: string; keyType: 'text' | 'bigint'; omit: string[] }>;

export type ExportSection = keyof typeof EXPORT_SECTIONS;

/**
 * One page of the account's rows of `section`, in key order after `after` (null: from the
 * start), each as JSON without `account_id` and the section's omitted columns, with the key to
 * page on from. Keyset paging: a page is one short query, however large the table.
 */
export async function pageOfSection(
  sql: Sql,
  section: ExportSection,
  accountId: string,
  after: string | null,
  limit: number,
): Promise<{ key: string; row: Record<string, unknown> }[]> {
  const s = EXPORT_SECTIONS[section];
  const omit = ['account_id', ...s.omit];
  const from =
    after === null
      ? sql``
      : s.keyType === 'bigint'
        ? sql`AND t.${sql(s.key)} > ${after}::bigint`
        : sql`AND t.${sql(s.key)} > ${after}::text`;
  return sql<{ key: string; row: Record<string, unknown> }[]>`
    SELECT t.${sql(s.key)}::text AS key, to_jsonb(t) - ${omit}::text[] AS row
    FROM ${sql(s.table)} t
    WHERE t.account_id = ${accountId}
      ${from}
    ORDER BY t.${sql(s.key)} LIMIT ${limit}`;
}
