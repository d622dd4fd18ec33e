import { TENANT_STREAM, type TenantEventKind } from '@svc/core';
import type { outbox } from '@svc/db';

/**
 * The event that tells a tenant's watchers a list changed (SPEC "Stream events"): `conversations`
 * on create, title, read, delete or finish; `team` when the roster or a runner changes;
 * `schedule` when a schedule changes or fires. Clients list the resources again. Written into
 * the outbox with the change itself.
 */
export function changed(kind: TenantEventKind): outbox.OutboxEvent {
  return { conversationId: null, kind, stream: TENANT_STREAM, data: JSON.stringify({ reason: 'changed' }) };
}
