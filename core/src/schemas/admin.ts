import { z } from 'zod';
import { AuditQuery, AuditRow } from './audit.ts';
import { Role } from './auth.ts';
import { Timestamp } from './common.ts';
import { SANDBOX_STATUSES } from './sandboxes.ts';

const flag = z.enum(['true', 'false']).transform((v) => v === 'true');

/** `page` (from 1) and `per_page` (default 50, max 200) of every admin list. */
export const AdminPaging = z.object({
  page: z.coerce.number().int().min(1).default(1),
  per_page: z.coerce.number().int().min(1).max(200).default(50),
});

export const AdminPageMeta = z.object({ page: z.int(), per_page: z.int(), total: z.int() });

export const AdminUsersQuery = AdminPaging.extend({
  q: z.string().min(1).max(200).optional().meta({ description: 'A substring of the email, or the exact account id.' }),
  comped: flag.optional(),
  role: Role.optional(),
  verified: flag.optional(),
  sort: z.enum(['created_at', 'email', 'last_active_at']).default('created_at'),
  dir: z.enum(['asc', 'desc']).default('desc'),
});

export const AdminUser = z
  .object({
    id: z.string(),
    email: z.string(),
    role: Role,
    verified: z.boolean(),
    comped: z.boolean(),
    suspended: z.boolean(),
    sandbox_limit: z.int().nullable().meta({ description: 'null: the instance default (SANDBOX_QUOTA_DEFAULT).' }),
    created_at: Timestamp,
    last_active_at: Timestamp.nullable(),
    usage: z.object({ active_sandboxes: z.int(), conversations: z.int(), turns: z.int() }),
  })
  .meta({ id: 'AdminUser' });

export const AdminUserPage = z.object({ data: z.array(AdminUser), meta: AdminPageMeta });

export const AdminRoleBody = z.object({ role: Role });
export const AdminSandboxLimitBody = z.object({
  limit: z
    .int()
    .min(0)
    .max(100_000)
    .nullable()
    .meta({ description: 'null returns the account to the instance default.' }),
});
export const AdminSuspendBody = z.object({ suspended: z.boolean() });

export const AdminSandbox = z
  .object({
    id: z.string(),
    account_id: z.string(),
    provider: z.string(),
    mode: z.string(),
    status: z.enum(SANDBOX_STATUSES),
    runner_id: z.string().nullable(),
    agent_id: z.string().nullable(),
    conversations: z.int().meta({ description: 'How many conversations it holds (their content is never shown).' }),
    created_at: Timestamp,
  })
  .meta({ id: 'AdminSandbox' });

export const AdminSandboxesQuery = AdminPaging.extend({
  account_id: z.string().min(1).max(100).optional(),
  status: z.enum(SANDBOX_STATUSES).optional(),
});

export const AdminSandboxPage = z.object({ data: z.array(AdminSandbox), meta: AdminPageMeta });

export const AdminAuditQuery = AuditQuery.extend({
  account_id: z.string().min(1).max(100).optional().meta({ description: "Only this account's rows." }),
});

export const AdminAuditPage = z.object({
  data: z.array(AuditRow.extend({ account_id: z.string() })),
  meta: z.object({ limit: z.int(), has_more: z.boolean(), next_cursor: z.string().nullable() }),
});

/**
 * Every action the privilege trail records, with the `metadata` keys each carries. The one
 * list: the services record only these (AdminAction), and the route's description is made
 * from it, so the documentation cannot leave one out. (The response schema takes any string:
 * see AdminEvent.)
 */
export const ADMIN_ACTIONS = {
  'admin.user.role': ['from', 'to'],
  'admin.user.sandbox_limit': ['from', 'to'],
  'admin.user.suspend': ['suspended', 'sandboxes_stopped'],
  'admin.user.delete': [],
  'admin.user.comp': ['from', 'to'],
  'admin.user.credits': ['cents'],
  'admin.sandbox.reap': ['account_id', 'status_before'],
} as const satisfies Record<string, readonly string[]>;

export type AdminAction = keyof typeof ADMIN_ACTIONS;

/** The actions in words for a description: each in backticks, with its metadata keys. */
export function describeAdminActions(): string {
  return Object.entries(ADMIN_ACTIONS)
    .map(([action, keys]) =>
      keys.length ? `\`${action}\` (${keys.map((k) => `\`${k}\``).join(', ')})` : `\`${action}\``,
    )
    .join(', ');
}

export const AdminEvent = z
  .object({
    id: z.string(),
    admin_id: z.string().meta({ description: 'The admin who acted.' }),
    // Open strings, not enums: the trail is read back from the database, where a newer node
    // in a rolling deploy may have recorded an action (or a target type) this one does not
    // know, and the answer must not fail for it. The route's description lists them.
    action: z.string().meta({ description: 'What was done (the actions are listed on GET /api/admin/events).' }),
    target_type: z.string().meta({ description: '`account` or `sandbox`.' }),
    target_id: z.string(),
    metadata: z.record(z.string(), z.unknown()),
    request_ip: z.string().nullable(),
    created_at: Timestamp,
  })
  .meta({ id: 'AdminEvent' });

export const AdminEventPage = z.object({ data: z.array(AdminEvent), meta: AdminPageMeta });
