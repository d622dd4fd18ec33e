import { ApiError } from '@svc/core';
import { admin, type Sql } from '@svc/db';

// An account as an operator sees it (`GET /api/admin/users/:id`): its standing and usage
// counts, never its content. Shared by the admin and billing-admin services.

/** The wire shape of an account for operators. */
export function shapeUser(r: admin.AdminUserRow) {
  return {
    id: r.id,
    email: r.email,
    role: r.role,
    verified: r.verified,
    comped: r.comped,
    suspended: r.suspended,
    sandbox_limit: r.sandbox_limit,
    created_at: r.created_at.toISOString(),
    last_active_at: r.last_active_at?.toISOString() ?? null,
    usage: { active_sandboxes: r.active_sandboxes, conversations: r.conversations, turns: r.turns },
  };
}

/** One account as an operator sees it; 404 when no account has the id. */
export async function getUser(sql: Sql, id: string) {
  const row = await admin.getUser(sql, id);
  if (!row) throw new ApiError('not_found', 'No account has that id.');
  return shapeUser(row);
}
