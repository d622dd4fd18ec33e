import type { LogEvent } from './log.ts';

/**
 * Consumer groups on a tenant's log: the port a worker reads the log through when it must see
 * every event at least once, across crashes of its own processes (webhooks). Redis Streams
 * consumer groups on Redis; the same bookkeeping in memory on the embedded defaults.
 *
 * A group has a position (the last id it handed out) and a pending list (events handed to a
 * consumer and not yet acknowledged). Events are handed out in id order; an event leaves the
 * pending list only when acknowledged, so an event a consumer took and never acknowledged (it
 * died, or its work failed) is handed out again by `claim` once it has been idle long enough.
 *
 * The hot log keeps what a group still needs (the copier's trim holds at `holdFrom`) up to a
 * bound; a group that falls further behind finds its position below the trim point: `read`
 * answers `behind`, the caller reads that range from the durable copy and then `advance`s the
 * position past it. Nothing is skipped either way.
 */
export interface ConsumerGroups {
  /**
   * Creates the tenant's group positioned after `after` (the next event handed out is the first
   * with a higher id), unless it exists: an existing group keeps its position. Idempotent.
   */
  create(tenant: string, after: number): Promise<void>;
  /**
   * Hands `consumer` up to `count` events after the group's position, oldest first, moves the
   * position to the last and adds them to the pending list. `behind` when the hot log may no
   * longer hold the events right after the position (it is below the trim point `below`);
   * then nothing is handed out. `missing` when the tenant has no group.
   */
  read(tenant: string, consumer: string, count: number): Promise<GroupRead>;
  /** Acknowledges: the events leave the pending list and are never handed out again. Idempotent. */
  ack(tenant: string, ids: number[]): Promise<void>;
  /**
   * Hands `consumer` up to `count` pending events nobody acknowledged for `minIdleMs` (their
   * consumer died or failed), oldest first; they stay pending, now as this consumer's. Pending
   * events the hot log no longer holds come back as `gone` ids and leave the pending list: the
   * caller reads them from the durable copy. Consumers that hold nothing and were idle for
   * `minIdleMs` are forgotten (each process names its own, so the dead would pile up).
   */
  claim(
    tenant: string,
    consumer: string,
    minIdleMs: number,
    count: number,
  ): Promise<{ events: LogEvent[]; gone: number[] }>;
  /**
   * Moves the group's position from `from` to `to` if it is still `from` (a catch-up from the
   * durable copy is done); false when another consumer moved it meanwhile.
   */
  advance(tenant: string, from: number, to: number): Promise<boolean>;
  /**
   * The lowest id the group still needs from the hot log (its oldest pending event, or the one
   * after its position); undefined when the tenant has no group. What the trim holds.
   */
  holdFrom(tenant: string): Promise<number | undefined>;
  /** Removes the tenant's group (it has no more use for it); the trim stops holding. Idempotent. */
  drop(tenant: string): Promise<void>;
}

export type GroupRead =
  | { status: 'read'; events: LogEvent[] }
  | { status: 'behind'; after: number; below: number }
  | { status: 'missing' };
