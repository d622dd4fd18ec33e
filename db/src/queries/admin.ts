import type postgres from 'postgres';
import type { Sql } from '../connect.ts';

/** An account as an operator sees it: facts and counts, never content. */
export interface AdminUserRow {
  id: string;
  email: string;
  role: 'user' | 'admin';
  verified: boolean;
  comped: boolean;
  suspended: boolean;
  sandbox_limit: number | null;
  created_at: Date;
  last_active_at: Date | null;
  active_sandboxes: number;
  conversations: number;
  turns: number;
}

export interface AdminUserFilter {
  q?: string | undefined;
  comped?: boolean | undefined;
  role?: 'user' | 'admin' | undefined;
  verified?: boolean | undefined;
  sort: 'created_at' | 'email' | 'last_active_at';
  dir: 'asc' | 'desc';
  limit: number;
  offset: number;
}

function selectUsers(sql: Sql) {
  return sql`
    SELECT a.id, a.email, a.role, a.email_verified_at IS NOT NULL AS verified, a.comped, a.suspended,
      a.sandbox_limit, a.created_at,
      greatest(
        (SELECT max(k.last_used_at) FROM api_keys k WHERE k.account_id = a.id AND k.kind <> 'sandbox'),
        (SELECT max(s.created_at) FROM sessions s WHERE s.account_id = a.id),
        (SELECT max(c.last_active_at) FROM conversations c WHERE c.account_id = a.id)) AS last_active_at,
      (SELECT count(*)::int FROM sandboxes sb WHERE sb.account_id = a.id
         AND sb.status IN ('provisioning', 'ready', 'suspended')) AS active_sandboxes,
      (SELECT count(*)::int FROM conversations c WHERE c.account_id = a.id) AS conversations,
      (SELECT count(*)::int FROM turns t WHERE t.account_id = a.id) AS turns
    FROM accounts a`;
}

function userWhere(sql: Sql, f: AdminUserFilter) {
  // `q` is a literal substring of the email or the exact id: LIKE's wildcards are escaped.
  const like = f.q === undefined ? null : `%${f.q.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
  return sql`WHERE true
    ${like === null ? sql`` : sql`AND (a.email ILIKE ${like} OR a.id = ${f.q ?? ''})`}
    ${f.comped === undefined ? sql`` : sql`AND a.comped = ${f.comped}`}
    ${f.role === undefined ? sql`` : sql`AND a.role = ${f.role}`}
    ${f.verified === undefined ? sql`` : sql`AND (a.email_verified_at IS NOT NULL) = ${f.verified}`}`;
}

/** One page of accounts and the total that match, ordered by `sort` then id for stable pages. */
export async function listUsers(sql: Sql, f: AdminUserFilter): Promise<{ rows: AdminUserRow[]; total: number }> {
  const dir = f.dir === 'asc' ? sql`ASC` : sql`DESC`;
  const nulls = f.dir === 'asc' ? sql`NULLS FIRST` : sql`NULLS LAST`;
  const rows = await sql<AdminUserRow[]>`
    SELECT * FROM (${selectUsers(sql)} ${userWhere(sql, f)}) u
    ORDER BY ${sql(f.sort)} ${dir} ${nulls}, id ${dir}
    LIMIT ${f.limit} OFFSET ${f.offset}`;
  const [count] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM accounts a ${userWhere(sql, f)}`;
  return { rows, total: count?.n ?? 0 };
}

export async function getUser(sql: Sql, id: string): Promise<AdminUserRow | undefined> {
  const rows = await sql<AdminUserRow[]>`${selectUsers(sql)} WHERE a.id = ${id}`;
  return rows[0];
}

/** Sets one operator-controlled field of an account; false when there is no such account. */
export async function updateUser(
  sql: Sql,
  id: string,
  change: { role: 'user' | 'admin' } | { sandbox_limit: number | null } | { suspended: boolean },
): Promise<boolean> {
  const rows = await sql`UPDATE accounts SET ${sql(change as Record<string, unknown>)}, updated_at = now()
                         WHERE id = ${id} RETURNING id`;
  return rows.length === 1;
}

/** The admin-set sandbox limit of the account, or null for the instance default. */
export async function sandboxLimitOf(sql: Sql, accountId: string): Promise<number | null> {
  const rows = await sql<
    { sandbox_limit: number | null }[]
  >`SELECT sandbox_limit FROM accounts WHERE id = ${accountId}`;
  return rows[0]?.sandbox_limit ?? null;
}

export interface AdminEventInsert {
  adminId: string;
  action: string;
  targetType: string;
  targetId: string;
  metadata?: Record<string, unknown>;
  requestIp: string | null;
}

export interface AdminEventRow {
  id: string;
  admin_id: string;
  action: string;
  target_type: string;
  target_id: string;
  metadata: Record<string, unknown>;
  request_ip: string | null;
  created_at: Date;
}

export async function insertAdminEvent(sql: Sql, e: AdminEventInsert): Promise<void> {
  await sql`INSERT INTO admin_events (admin_id, action, target_type, target_id, metadata, request_ip)
            VALUES (${e.adminId}, ${e.action}, ${e.targetType}, ${e.targetId},
                    ${sql.json((e.metadata ?? {}) as postgres.JSONValue)}, ${e.requestIp})`;
}

/** Newest first; a page and the total. */
export async function listAdminEvents(
  sql: Sql,
  page: { limit: number; offset: number },
): Promise<{ rows: AdminEventRow[]; total: number }> {
  const rows = await sql<AdminEventRow[]>`
    SELECT id::text AS id, admin_id, action, target_type, target_id, metadata, request_ip, created_at
    FROM admin_events ORDER BY admin_events.id DESC LIMIT ${page.limit} OFFSET ${page.offset}`;
  const [count] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM admin_events`;
  return { rows, total: count?.n ?? 0 };
}

/** A sandbox of any account, as an operator lists it: identity and state, no content. */
export interface AdminSandboxRow {
  id: string;
  account_id: string;
  provider: string;
  mode: string;
  status: string;
  runner_id: string | null;
  agent_id: string | null;
  conversations: number;
  created_at: Date;
}

function selectSandboxes(sql: Sql) {
  return sql`
    SELECT s.id, s.account_id, s.provider, s.mode, s.status, s.runner_id, s.agent_id, s.created_at,
      (SELECT count(*)::int FROM conversations c WHERE c.sandbox_id = s.id AND c.account_id = s.account_id) AS conversations
    FROM sandboxes s`;
}

export async function listAllSandboxes(
  sql: Sql,
  f: { accountId?: string | undefined; statuses?: string[] | undefined; limit: number; offset: number },
): Promise<{ rows: AdminSandboxRow[]; total: number }> {
  const where = sql`WHERE true
    ${f.accountId === undefined ? sql`` : sql`AND s.account_id = ${f.accountId}`}
    ${f.statuses?.length ? sql`AND s.status = ANY(${f.statuses})` : sql``}`;
  const rows = await sql<AdminSandboxRow[]>`
    ${selectSandboxes(sql)} ${where}
    ORDER BY s.created_at DESC, s.id DESC LIMIT ${f.limit} OFFSET ${f.offset}`;
  const [count] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM sandboxes s ${where}`;
  return { rows, total: count?.n ?? 0 };
}

/** A sandbox of any account, or undefined. */
export async function getAnySandbox(sql: Sql, id: string): Promise<AdminSandboxRow | undefined> {
  const rows = await sql<AdminSandboxRow[]>`${selectSandboxes(sql)} WHERE s.id = ${id}`;
  return rows[0];
}
