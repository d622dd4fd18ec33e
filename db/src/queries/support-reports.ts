import type postgres from 'postgres';
import type { Sql } from '../connect.ts';

export type SupportCategory = 'bug' | 'stuck' | 'question' | 'idea' | 'other';
export type SupportStatus = 'new' | 'forwarded' | 'failed';

/** A report as read back: every column but the screenshot's bytes, which only `screenshotOf` reads. */
export interface SupportReportRow {
  id: string;
  account_id: string;
  category: SupportCategory;
  message: string;
  context: Record<string, unknown> | null;
  client: string | null;
  screenshot_media_type: string | null;
  /** Size of the stored screenshot; null when there is none. */
  screenshot_bytes: number | null;
  status: SupportStatus;
  attempts: number;
  next_attempt_at: Date;
  claimed_until: Date | null;
  issue_url: string | null;
  mailed_at: Date | null;
  forwarded_at: Date | null;
  forward_error: string | null;
  created_at: Date;
  updated_at: Date;
}

export interface SupportReportInsert {
  id: string;
  accountId: string;
  category: SupportCategory;
  message: string;
  context: Record<string, unknown> | null;
  client: string | null;
  screenshot: { mediaType: string; bytes: Uint8Array } | null;
}

// The columns of SupportReportRow: the screenshot is measured, never read, on every path but one.
const columns = (sql: Sql) => sql`id, account_id, category, message, context, client, screenshot_media_type,
  octet_length(screenshot) AS screenshot_bytes, status, attempts, next_attempt_at, claimed_until,
  issue_url, mailed_at, forwarded_at, forward_error, created_at, updated_at`;

export async function insertReport(sql: Sql, r: SupportReportInsert): Promise<SupportReportRow> {
  const rows = await sql<SupportReportRow[]>`
    INSERT INTO support_reports (id, account_id, category, message, context, client, screenshot, screenshot_media_type)
    VALUES (${r.id}, ${r.accountId}, ${r.category}, ${r.message},
            ${r.context === null ? null : sql.json(r.context as postgres.JSONValue)}, ${r.client},
            ${r.screenshot?.bytes ?? null}, ${r.screenshot?.mediaType ?? null})
    RETURNING ${columns(sql)}`;
  return rows[0] as SupportReportRow;
}

/** The account's reports, newest first (ids sort by creation time). */
export async function listReports(sql: Sql, accountId: string): Promise<SupportReportRow[]> {
  return sql<SupportReportRow[]>`
    SELECT ${columns(sql)} FROM support_reports WHERE account_id = ${accountId} ORDER BY id DESC`;
}

/** The account's report `id`; another account's reads as missing. */
export async function getReport(sql: Sql, accountId: string, id: string): Promise<SupportReportRow | undefined> {
  const rows = await sql<SupportReportRow[]>`
    SELECT ${columns(sql)} FROM support_reports WHERE account_id = ${accountId} AND id = ${id}`;
  return rows[0];
}

/** The screenshot of report `id` (of any account: the forwarder's read), or undefined. */
export async function screenshotOf(
  sql: Sql,
  id: string,
): Promise<{ media_type: string; bytes: Uint8Array } | undefined> {
  const rows = await sql<{ media_type: string; bytes: Uint8Array }[]>`
    SELECT screenshot_media_type AS media_type, screenshot AS bytes
    FROM support_reports WHERE id = ${id} AND screenshot IS NOT NULL`;
  return rows[0];
}

/**
 * Claims up to `limit` reports still `new` whose next attempt is due at `now` and that no live
 * lease holds, for `leaseUntil`, counting the attempt. Rows another transaction is claiming are
 * skipped (`FOR UPDATE SKIP LOCKED`), so concurrent forwarders never claim one row twice; a
 * lease that expired (its worker died) is claimed again.
 */
export async function claimDue(sql: Sql, now: Date, leaseUntil: Date, limit: number): Promise<SupportReportRow[]> {
  return sql<SupportReportRow[]>`
    UPDATE support_reports SET claimed_until = ${leaseUntil}, attempts = attempts + 1, updated_at = now()
    WHERE id IN (
      SELECT id FROM support_reports
      WHERE status = 'new' AND next_attempt_at <= ${now} AND (claimed_until IS NULL OR claimed_until <= ${now})
      ORDER BY next_attempt_at, id LIMIT ${limit}
      FOR UPDATE SKIP LOCKED)
    RETURNING ${columns(sql)}`;
}

/** Records that the issue for report `id` was opened at `url`, so no retry opens another. */
export async function recordIssue(sql: Sql, id: string, url: string): Promise<void> {
  await sql`UPDATE support_reports SET issue_url = ${url}, updated_at = now() WHERE id = ${id}`;
}

/** Records that report `id` was mailed at `at`, so no retry mails it again. */
export async function recordMailed(sql: Sql, id: string, at: Date): Promise<void> {
  await sql`UPDATE support_reports SET mailed_at = ${at}, updated_at = now() WHERE id = ${id}`;
}

/** Report `id` reached every configured destination: `forwarded`, and the claim released. */
export async function markForwarded(sql: Sql, id: string, at: Date): Promise<void> {
  await sql`
    UPDATE support_reports SET status = 'forwarded', forwarded_at = ${at}, forward_error = NULL,
      claimed_until = NULL, updated_at = now()
    WHERE id = ${id} AND status = 'new'`;
}

/**
 * An attempt failed with `error`: the claim is released and the report is tried again at
 * `retryAt`, or, with `retryAt` null, it ends `failed`.
 */
export async function recordFailure(sql: Sql, id: string, error: string, retryAt: Date | null): Promise<void> {
  await sql`
    UPDATE support_reports SET forward_error = ${error}, claimed_until = NULL, updated_at = now(),
      ${retryAt === null ? sql`status = 'failed'` : sql`next_attempt_at = ${retryAt}`}
    WHERE id = ${id} AND status = 'new'`;
}
