/**
 * A log event as stored and delivered, before it is shaped for the wire (snake_case there).
 * `id` is the tenant-wide event id; `ts` its time (ISO 8601, UTC): when it happened, where its
 * producer said (a runner's held output), else when it was appended. Shared by the log
 * adapters, the Postgres copy and the readers.
 *
 * `conversationId` is null for a tenant event: a `conversations`, `team` or `schedule` change
 * (kinds in TENANT_EVENT_KINDS) that belongs to no one conversation. `producer` and `seq` say
 * who emitted the event under which number; they stay inside the service (the copier keeps
 * each producer's durable mark from them) and never reach the wire.
 */
export interface LogEvent {
  id: number;
  conversationId: string | null;
  turnId: string | null;
  kind: string;
  stream: string;
  data: string | null;
  stage: string | null;
  state: string | null;
  durationMs: number | null;
  ts: string;
  producer: string;
  seq: number;
}

/**
 * What a producer emits: a log event before the log gives it an id (and before the write path
 * stamps its time and producer). The outbox stores events in this shape too.
 */
export interface NewEvent {
  /** Null for a tenant event (a `conversations`, `team` or `schedule` change). */
  conversationId: string | null;
  turnId?: string | null;
  kind: string;
  stream: string;
  data?: string | null;
  stage?: string | null;
  state?: string | null;
  durationMs?: number | null;
  /** When it happened (ISO 8601), where its producer said so; else its `ts` is the append time. */
  at?: string;
}

/** Kinds of the tenant events, each sent as an SSE event of that name with `{reason: changed}`. */
export const TENANT_EVENT_KINDS = ['conversations', 'team', 'schedule'] as const;
export type TenantEventKind = (typeof TENANT_EVENT_KINDS)[number];
/** The stream tenant events are on; never one a client filters by. */
export const TENANT_STREAM = 'tenant';
