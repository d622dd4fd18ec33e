import { ApiError, validationFailed } from '@svc/core';
import { audit, type Sql } from '@svc/db';
import type { ActorRef } from './principal.ts';

/**
 * Appends one audit row. Metadata carries facts about the change (sizes, keys, names of
 * fields), never content: no prompt, message, secret value or token.
 */
export async function recordAudit(
  sql: Sql,
  who: ActorRef,
  action: string,
  resource: { type?: string; id?: string } = {},
  metadata: Record<string, unknown> = {},
): Promise<void> {
  await audit.insertAuditEvent(sql, {
    accountId: who.accountId,
    actor: who.actor,
    action,
    resourceType: resource.type ?? null,
    resourceId: resource.id ?? null,
    metadata,
    requestIp: who.ip,
  });
}

/** An optional ISO 8601 query parameter as an instant; anything else is 400 `invalid_request` naming it. */
export function parseInstant(name: string, value: string | undefined): Date | undefined {
  if (value === undefined) return undefined;
  // ISO 8601 date or date-time; Date.parse alone accepts too much ("1", "May 5").
  const iso = /^\d{4}-\d{2}-\d{2}([Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:?\d{2})?)?$/;
  const ms = iso.test(value) ? Date.parse(value) : Number.NaN;
  if (Number.isNaN(ms)) throw new ApiError('invalid_request', `${name} must be an ISO 8601 timestamp`);
  return new Date(ms);
}

export interface AuditListQuery {
  limit: number;
  before?: string | undefined;
  action_prefix?: string | undefined;
  resource_type?: string | undefined;
  since?: string | undefined;
  until?: string | undefined;
}

/** Newest first, own tenant only; `meta.next_cursor` pages backwards through `before`. */
export async function listAudit(sql: Sql, accountId: string, q: AuditListQuery) {
  const page = await readAudit(sql, accountId, q);
  return { ...page, data: page.data.map(({ account_id: _, ...row }) => row) };
}

/**
 * The operator's view: every tenant's rows (or one account's), each naming its account. Audit
 * metadata never holds content, so this crosses tenants without carrying any.
 */
export async function listAuditOfEveryAccount(sql: Sql, q: AuditListQuery & { account_id?: string | undefined }) {
  return readAudit(sql, q.account_id ?? null, q);
}

async function readAudit(sql: Sql, accountId: string | null, q: AuditListQuery) {
  const since = parseInstant('since', q.since);
  const until = parseInstant('until', q.until);
  if (since && until && since > until) throw validationFailed({ since: ['must not be after until'] });
  const rows = await audit.listAuditEvents(sql, accountId, {
    limit: q.limit,
    before: q.before === undefined ? undefined : BigInt(q.before),
    actionPrefix: q.action_prefix,
    resourceType: q.resource_type,
    since,
    until,
  });
  const hasMore = rows.length > q.limit;
  const page = rows.slice(0, q.limit);
  return {
    data: page.map((r) => ({ ...r, inserted_at: r.inserted_at.toISOString() })),
    meta: { limit: q.limit, has_more: hasMore, next_cursor: hasMore ? (page.at(-1)?.id ?? null) : null },
  };
}
