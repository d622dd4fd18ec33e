import { z } from 'zod';
import { Timestamp } from './common.ts';

export const Actor = z.enum(['ui', 'api', 'sprite', 'system']);
export type Actor = z.infer<typeof Actor>;

export const AuditRow = z
  .object({
    id: z.string(),
    inserted_at: Timestamp,
    actor: Actor,
    action: z.string(),
    resource_type: z.string().nullable(),
    resource_id: z.string().nullable(),
    metadata: z.record(z.string(), z.unknown()),
    request_ip: z.string().nullable(),
  })
  .meta({ id: 'AuditRow' });

export const AuditQuery = z.object({
  limit: z.coerce.number().int().min(1).max(500).default(100),
  before: z.string().regex(/^\d+$/, 'must be a cursor from meta.next_cursor').optional(),
  action_prefix: z.string().max(200).optional(),
  resource_type: z.string().max(100).optional(),
  since: z.string().optional(),
  until: z.string().optional(),
});

export const AuditPage = z.object({
  data: z.array(AuditRow),
  meta: z.object({ limit: z.int(), has_more: z.boolean(), next_cursor: z.string().nullable() }),
});
