/**
 * A log event as stored and delivered, before it is shaped for the wire (snake_case there).
 * `id` is the tenant-wide event id; `ts` the append time (ISO 8601, UTC). Shared by the log
 * adapters, the Postgres copy and the readers.
 */
export interface LogEvent {
  id: number;
  conversationId: string;
  turnId: string | null;
  kind: string;
  stream: string;
  data: string | null;
  stage: string | null;
  state: string | null;
  durationMs: number | null;
  ts: string;
}
