import { type LogEvent, type NewEvent, nulAsReplacement } from '@svc/core';

/**
 * The event log port. One tenant's events share one id space: ids are integers, strictly
 * increasing within a tenant (so within a conversation), never reused, never going backwards,
 * even after the store loses its data (ids come from max(last + 1, clock in microseconds)).
 *
 * `append` is the only write path. Producers number their events (`seq`, per producer); the
 * log keeps each producer's high-water mark, so a resend of what it already has is a no-op
 * (`duplicate`) and a jump past it is refused (`gap`: resend from `hwm + 1`). Redaction is the
 * caller-facing part of append and lives in `appendEvents` (log.append.ts), the one function
 * every producer goes through.
 */

export type { LogEvent, NewEvent };

/**
 * Microseconds since the epoch: the floor under every new id. The wall clock to the
 * millisecond, its microseconds read from the high-resolution clock (anchored to the wall clock
 * at process start) while the two agree on the millisecond; where they do not (the wall clock
 * was set since, or this thread was paused between the two reads) the millisecond alone.
 */
export function clockMicros(): number {
  const ms = Date.now();
  const precise = performance.timeOrigin + performance.now();
  return precise >= ms && precise < ms + 1 ? Math.floor(precise * 1000) : ms * 1000;
}

/** How far an event's id may lie from its `ts` and still be read as the time of its append. */
const ID_AS_TIME_WITHIN_US = 1_000_000;

/**
 * When the event was appended, in microseconds since the epoch, as exactly as the log knows:
 * its id, which the append took from the clock (id = max(last + 1, clock in microseconds), in
 * the same script that stored it), so two events of a tenant never share a time and their times
 * follow their ids. An id more than a second from the event's `ts` (the appending node's clock,
 * to the millisecond) is not a clock reading (ids ran ahead of a clock set back, or a test's log
 * counts from 0): then `ts`.
 */
export function appendedAtMicros(e: Pick<LogEvent, 'id' | 'ts'>): number {
  const stamped = Date.parse(e.ts) * 1000;
  return Math.abs(e.id - stamped) <= ID_AS_TIME_WITHIN_US ? e.id : stamped;
}

/** `2026-11-25T06:56:45.123456Z`: a time in microseconds since the epoch as ISO 8601, UTC. */
export function isoMicros(us: number): string {
  const ms = Math.floor(us / 1000);
  const micros = String(us - ms * 1000).padStart(3, '0');
  return new Date(ms).toISOString().replace(/Z$/, `${micros}Z`);
}

/**
 * A text field as stored: NUL, which Postgres text cannot hold, becomes U+FFFD (what a decoder
 * gives for a byte it cannot map). A NUL in a runner's output would otherwise reach the hot log
 * and then fail its durable copy at every try, stalling the copy of the tenant's whole log.
 */
function storable(s: string | null | undefined): string | null {
  if (s === undefined || s === null) return null;
  return nulAsReplacement(s);
}

/**
 * The stored fields of an event the producer emitted, stamped `ts` and the producer's name and
 * number (the id comes from the log). Hot and durable copies hold the same text (storable()).
 */
export function storedFields(e: NewEvent, ts: string, producer: string, seq: number): Omit<LogEvent, 'id'> {
  return {
    conversationId: e.conversationId,
    turnId: storable(e.turnId),
    kind: e.kind,
    stream: e.stream,
    data: storable(e.data),
    stage: storable(e.stage),
    state: storable(e.state),
    durationMs: e.durationMs ?? null,
    ts: e.at ?? ts,
    producer,
    seq,
  };
}

export interface AppendInput {
  tenant: string;
  producer: string;
  /** The producer's number for the first event; the rest follow consecutively unless `seqs` is given. */
  seq: number;
  events: NewEvent[];
  /**
   * Per-event producer numbers, non-decreasing, when not consecutive: the write path may add
   * events that share the number of the event they precede (redaction's flush does).
   */
  seqs?: number[];
}

/** The producer number of each event of an append. */
export function seqsOf(input: AppendInput): number[] {
  return input.seqs ?? input.events.map((_, i) => input.seq + i);
}

export type AppendResult =
  | { status: 'appended'; events: LogEvent[]; hwm: number }
  | { status: 'duplicate'; events: []; hwm: number }
  | { status: 'gap'; events: []; hwm: number };

/** A batch as published live: the ids before it so a subscriber can tell it missed nothing. */
export interface LiveBatch {
  tenant: string;
  /** The tenant's last id before this batch's first event. */
  prev: number;
  events: LogEvent[];
}

export interface ReadOptions {
  /** Only this conversation's events (else the tenant's). */
  conversationId?: string;
  /** Exclusive lower bound on the id. */
  after: number;
  limit: number;
}

/**
 * Where a producer's durable mark is kept when the hot log has none (a new producer, or the
 * store lost its data): the Postgres copy. Undefined when the producer never had anything
 * copied, and then its first append is taken as it comes.
 */
export type LoadMark = (tenant: string, producer: string) => Promise<number | undefined>;

/** The hot tail is trimmed back to `keep` once it has grown a TRIM_SLACK-th past it. */
export const TRIM_SLACK = 10;

/** What a trim may drop: see EventLog.trim. */
export interface TrimOptions {
  upTo: number;
  keep: number;
  hold?: number | undefined;
  maxHeld?: number | undefined;
}

/**
 * The id below which a trim may drop events, given the tail's length and a way to find the
 * id of the event at a position (0 is the oldest): below the durable mark and the hold, but
 * the hold gives way where it would keep more than `maxHeld` events. Both adapters use it.
 */
export async function trimLimit(
  o: TrimOptions,
  length: number,
  idAt: (index: number) => Promise<number>,
): Promise<number> {
  let limit = o.upTo + 1;
  if (o.hold !== undefined) {
    const over = length - (o.maxHeld ?? Number.POSITIVE_INFINITY);
    limit = Math.min(limit, over > 0 ? Math.max(o.hold, await idAt(over)) : o.hold);
  }
  return limit;
}

/**
 * One load per producer at a time, shared by every append waiting for it (the memory log's
 * way; the Redis log queues a producer's appends itself, see `redisEventLog`). A producer
 * keeps several appends in flight; each may find the mark missing, and they must take it in
 * the order they were made. Waiters of one promise resume in the order they began to wait,
 * so sharing the load keeps that order (separate loads could finish in any).
 */
export function sharedMarkLoads(load: LoadMark): LoadMark {
  const inflight = new Map<string, Promise<number | undefined>>();
  return (tenant, producer) => {
    const key = `${tenant}\0${producer}`;
    let pending = inflight.get(key);
    if (!pending) {
      pending = load(tenant, producer).finally(() => inflight.delete(key));
      inflight.set(key, pending);
    }
    return pending;
  };
}

export interface EventLog {
  /**
   * Appends atomically: all of the batch's new events or none get ids, in order, and are
   * published live in one batch. A batch that overlaps the producer's mark appends only the
   * part beyond it.
   */
  append(input: AppendInput): Promise<AppendResult>;
  /** Events after `after`, oldest first, at most `limit`. */
  read(tenant: string, options: ReadOptions): Promise<LogEvent[]>;
  /** The tenant's last id (0 when it has none). */
  lastId(tenant: string): Promise<number>;
  /**
   * Delivers every batch appended for the tenant from now on, in id order and without gaps
   * (an adapter that can lose a message fills the hole from the stream before delivering
   * anything newer). Resolves once the subscription is live; the returned function ends it.
   */
  subscribe(tenant: string, onBatch: (batch: LiveBatch) => void): Promise<() => void>;
  /**
   * Trims the hot tail: drops events with ids at or below `upTo` (the durable copy's mark),
   * except the newest `keep` of the tenant, which stay hot for fast replay. Never drops an
   * event above `upTo`. Conversation streams follow at their next append. Nothing is done
   * until the tail holds more than `keep` plus a TRIM_SLACK-th of it, so most calls cost one
   * length check.
   *
   * With `hold` (the lowest id a consumer group has not acknowledged), events at or above it
   * stay too, as long as the tail then holds at most `maxHeld` events (default: no bound).
   * Past that the oldest go anyway: a group that far behind reads them from the durable copy
   * (the trim point tells it so), and the hot log's memory stays bounded.
   */
  trim(tenant: string, options: TrimOptions): Promise<void>;
  /**
   * The trim point: events with lower ids may be gone from the hot log (0 when nothing was
   * trimmed). Set before the events go, so a reader that checks it after reading cannot
   * miss a trim that raced its read.
   */
  floor(tenant: string): Promise<number>;
  /**
   * Forgets the tenant (its account was deleted): its hot log, conversation streams, producer
   * marks, last id and trim point are gone, and this node's live feed of it ends (its
   * subscribers hear nothing more). Other tenants are untouched. Idempotent. Call it once
   * nothing appends for the tenant any more: an append racing it may leave a trace. Ids given
   * to a later append still go up (they follow the clock), never reusing a forgotten one.
   */
  dropTenant(tenant: string): Promise<void>;
  close(): Promise<void>;
}
