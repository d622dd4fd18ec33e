import type postgres from 'postgres';
import type { Sql } from '../connect.ts';

export interface AuditInsert {
  accountId: string;
  actor: 'ui' | 'api' | 'sprite' | 'system';
  action: string;
  resourceType?: string | null;
  resourceId?: string | null;
  metadata?: Record<string, unknown>;
  requestIp?: string | null;
}

export interface AuditEventRow {
  id: string;
  account_id: string;
  inserted_at: Date;
  actor: 'ui' | 'api' | 'sprite' | 'system';
  action: string;
  resource_type: string | null;
  resource_id: string | null;
  metadata: Record<string, unknown>;
  request_ip: string | null;
}

export async function insertAuditEvent(sql: Sql, e: AuditInsert): Promise<void> {
  await sql`INSERT INTO audit_events (account_id, actor, action, resource_type, resource_id, metadata, request_ip)
            VALUES (${e.accountId}, ${e.actor}, ${e.action}, ${e.resourceType ?? null}, ${e.resourceId ?? null},
                    ${sql.json((e.metadata ?? {}) as postgres.JSONValue)}, ${e.requestIp ?? null})`;
}

export interface AuditFilter {
  limit: number;
  before?: bigint | undefined;
  actionPrefix?: string | undefined;
  resourceType?: string | undefined;
  since?: Date | undefined;
  until?: Date | undefined;
}

/**
 * Newest first by id as a number. `limit + 1` rows are read so the caller can tell whether
 * more exist. The id goes out as text (a bigint), so ORDER BY names the table's column: the
 * bare name would sort by the text alias, putting 9 before 25. `accountId` null reads every
 * tenant's rows (the operator's cross-tenant view).
 */
export async function listAuditEvents(sql: Sql, accountId: string | null, f: AuditFilter): Promise<AuditEventRow[]> {
  // action_prefix is a literal prefix: escape LIKE's wildcards so `a_b` matches only `a_b...`.
  const prefix = f.actionPrefix === undefined ? null : `${f.actionPrefix.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
  return sql<AuditEventRow[]>`
    SELECT id::text AS id, account_id, inserted_at, actor, action, resource_type, resource_id, metadata, request_ip
    FROM audit_events
    WHERE ${accountId === null ? sql`true` : sql`account_id = ${accountId}`}
      ${f.before === undefined ? sql`` : sql`AND id < ${f.before.toString()}::bigint`}
      ${prefix === null ? sql`` : sql`AND action LIKE ${prefix}`}
      ${f.resourceType === undefined ? sql`` : sql`AND resource_type = ${f.resourceType}`}
      ${f.since === undefined ? sql`` : sql`AND inserted_at >= ${f.since}`}
      ${f.until === undefined ? sql`` : sql`AND inserted_at < ${f.until}`}
    ORDER BY audit_events.id DESC
    LIMIT ${f.limit + 1}`;
}
