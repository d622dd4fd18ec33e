import { type EgressPage, orNotFound } from '@svc/core';
import { conversations, egressLog, type Sql } from '@svc/db';
import type { z } from 'zod';

/*
 * The broker's egress log as a tenant reads it: each request that left a conversation's
 * sandbox through the broker (host, binding, status, latency; a refusal and why), never a
 * path, query or body. Kept BROKER_LOG_RETENTION_HOURS after the conversation ends.
 */

/**
 * `GET /api/conversations/:id/egress`: newest first, `limit` rows a page; `meta.next_cursor`
 * (the last row's id) passed as `before` gives the next, older page. 404 for an unknown
 * conversation or another account's; a terminated one keeps its rows until the sweep.
 */
export async function listEgress(
  sql: Sql,
  accountId: string,
  conversationId: string,
  q: { limit: number; before?: number | undefined },
): Promise<z.infer<typeof EgressPage>> {
  orNotFound(await conversations.exists(sql, accountId, conversationId), 'Conversation');
  const rows = await egressLog.listEgress(sql, accountId, conversationId, q);
  const hasMore = rows.length > q.limit;
  const page = rows.slice(0, q.limit);
  return {
    data: page.map((r) => ({ ...r, at: r.at.toISOString() })),
    meta: { limit: q.limit, has_more: hasMore, next_cursor: hasMore ? (page.at(-1)?.id ?? null) : null },
  };
}
