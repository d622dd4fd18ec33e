import {
  AdminAuditPage,
  AdminAuditQuery,
  AdminEventPage,
  AdminPaging,
  AdminRoleBody,
  AdminSandbox,
  AdminSandboxesQuery,
  AdminSandboxLimitBody,
  AdminSandboxPage,
  AdminSuspendBody,
  AdminUser,
  AdminUserPage,
  AdminUsersQuery,
  describeAdminActions,
  IdParam,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import * as admin from '../../services/admin.ts';
import { getUser } from '../../services/admin-users.ts';
import { listAuditOfEveryAccount } from '../../services/audit.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['admin'];
/** Every admin route: role admin and a full-scope key or session; anyone else is 403 `forbidden`. */
const config = { auth: 'admin' as const };
const SELF =
  ' An admin acting on their own account is 422 `validation_failed` (`details.id`): another admin must do it, or use `DELETE /api/account`.';

export function adminRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const adminDeps: admin.AdminDeps = {
    sql: deps.sql,
    launch: deps.launch,
    exportFiles: deps.exportFiles,
    credentialCache: deps.credentialCache,
    erasure: {
      sql: deps.sql,
      fabric: deps.fabric,
      providers: deps.launch.providers,
      eventLog: deps.eventLog,
      logger: deps.log,
    },
  };

  r.get('/api/admin/users', {
    config,
    schema: {
      tags,
      summary: 'Every account, a page at a time (metadata and usage counts, never content)',
      description:
        '`q` matches a substring of the email or the exact id; `comped`, `verified` (`true`/`false`) and `role` filter; `sort` is `created_at` (default), `email` or `last_active_at`, `dir` `desc` (default) or `asc`; `page` from 1, `per_page` default 50, max 200. A value outside these is 400. `meta.total` counts every match.',
      querystring: AdminUsersQuery,
      response: { 200: AdminUserPage },
    },
    handler: async (req) => admin.listUsers(deps.sql, req.query),
  });

  r.get('/api/admin/users/:id', {
    config,
    schema: {
      tags,
      summary: 'One account',
      description:
        'The row the users list shows: role, verification, comped, suspension, the sandbox limit (null: the instance default), last activity (latest key use, login or conversation) and usage counts. 404 `not_found` for an unknown id.',
      params: IdParam,
      errors: ['not_found'],
      response: { 200: AdminUser },
    },
    handler: async (req) => getUser(deps.sql, req.params.id),
  });

  r.post('/api/admin/users/:id/role', {
    config,
    schema: {
      tags,
      summary: "Set an account's role",
      description: `Takes effect on the account's next request.${SELF}`,
      params: IdParam,
      body: AdminRoleBody,
      errors: ['not_found', 'validation_failed'],
      response: { 200: AdminUser },
    },
    handler: async (req) => admin.setRole(adminDeps, requirePrincipal(req), req.params.id, req.body.role),
  });

  r.post('/api/admin/users/:id/sandbox-limit', {
    config,
    schema: {
      tags,
      summary: "Set the account's active-sandbox limit (replaces SANDBOX_QUOTA_DEFAULT for it)",
      description:
        'Launches beyond it are 429 `sandbox_quota_exceeded` carrying `active` and this `limit`. `null` returns the account to the instance default. Sandboxes already running are left alone.',
      params: IdParam,
      body: AdminSandboxLimitBody,
      errors: ['not_found', 'validation_failed'],
      response: { 200: AdminUser },
    },
    handler: async (req) => admin.setSandboxLimit(deps.sql, requirePrincipal(req), req.params.id, req.body.limit),
  });

  r.post('/api/admin/users/:id/suspend', {
    config,
    schema: {
      tags,
      summary: 'Suspend or restore an account',
      description: `Suspended: every key and session of it is refused with 403 \`account_suspended\` (a sign-in with its password too), and before the answer each of its active sandboxes is reaped (conversations terminated, machine destroyed) and its runners disconnected and its open event streams ended on every node. While suspended nothing starts for it: a launch or prompt however it arrives is 403 \`account_suspended\`, and a due schedule launches nothing, records why in \`last_error\` and moves to its next slot. Restoring lets its keys work again; nothing is restarted.${SELF}`,
      params: IdParam,
      body: AdminSuspendBody,
      errors: ['not_found', 'validation_failed'],
      response: { 200: AdminUser },
    },
    handler: async (req) => admin.setSuspended(adminDeps, requirePrincipal(req), req.params.id, req.body.suspended),
  });

  r.delete('/api/admin/users/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete an account irreversibly, as DELETE /api/account does',
      description: `Its sandboxes are destroyed, its runners disconnected and its open event streams ended, every row and its encryption key erased. The privilege trail keeps that it happened (ids only).${SELF}`,
      params: IdParam,
      errors: ['not_found', 'validation_failed'],
      response: { 204: z.null() },
    },
    handler: async (req, reply) => {
      await admin.deleteUser(adminDeps, requirePrincipal(req), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.get('/api/admin/sandboxes', {
    config,
    schema: {
      tags,
      summary: "Every account's sandboxes, newest first (metadata only)",
      description: '`account_id` and `status` filter; `page`, `per_page` (default 50, max 200).',
      querystring: AdminSandboxesQuery,
      response: { 200: AdminSandboxPage },
    },
    handler: async (req) => admin.listSandboxes(deps.sql, req.query),
  });

  r.post('/api/admin/sandboxes/:id/reap', {
    config,
    schema: {
      tags,
      summary: 'Reap any sandbox: its conversations end, its machine is destroyed through its provider',
      description:
        'A running turn ends `interrupted`; the sandbox is `terminated` in the answer. Reaping an ended sandbox again is harmless. 404 `sandbox_not_found` for an unknown id.',
      params: IdParam,
      errors: ['sandbox_not_found'],
      response: { 200: AdminSandbox },
    },
    handler: async (req) => admin.reapSandbox(adminDeps, requirePrincipal(req), req.params.id),
  });

  r.get('/api/admin/audit', {
    config,
    schema: {
      tags,
      summary: "Every account's audit rows, newest first, each naming its account",
      description:
        'As `GET /api/audit` (same `limit`, `before`, `action_prefix`, `resource_type`, `since`, `until`) across tenants; `account_id` narrows to one. Audit metadata holds facts, never content.',
      querystring: AdminAuditQuery,
      response: { 200: AdminAuditPage },
    },
    handler: async (req) => listAuditOfEveryAccount(deps.sql, req.query),
  });

  r.get('/api/admin/events', {
    config,
    schema: {
      tags,
      summary: 'The privilege trail: every admin action (who, what, to whom, when), newest first',
      description: `Actions, each with the \`metadata\` keys it carries: ${describeAdminActions()}. Rows outlive the accounts they name. \`page\`, \`per_page\` (default 50, max 200).`,
      querystring: AdminPaging,
      response: { 200: AdminEventPage },
    },
    handler: async (req) => admin.listEvents(deps.sql, req.query),
  });
}
