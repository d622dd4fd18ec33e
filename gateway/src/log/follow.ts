import type { EventLog, LiveBatch, LogEvent } from './log.ts';

/** Where a follower's events go: a watcher's own object (a method, not a closure per watcher). */
export interface EventSink {
  onEvents(events: LogEvent[]): void;
}

const nothing = () => {};

/** What takes a tenant's live batches for one follower. */
export interface BatchSink {
  onBatch(batch: LiveBatch): void;
}

/**
 * Joins a watcher to a tenant's log without a gap (DESIGN.md "Live delivery"): subscribe
 * first and buffer what arrives, read the history after `after` and deliver it, then drain
 * the buffer dropping every id already delivered, then deliver live. `sink.onEvents` sees
 * every event after `after` exactly once, in id order. Resolves to the function that stops it.
 *
 * `after` 'now' starts at the tenant's last id, read once the subscription is live
 * (`onStart` is told it before anything is delivered): every later append then has a higher
 * id and comes through the subscription, so there is no history to read. Read before
 * subscribing instead, it would leave the appends in between to a read of the log (a copy
 * mark's SELECT in Postgres and two Redis calls, on every opening).
 */
export async function follow(
  log: EventLog,
  tenant: string,
  after: number | 'now',
  sink: EventSink,
  options: {
    /** With `after` 'now': the position it stands for, before anything is delivered. */
    onStart?: (after: number) => void;
    pageSize?: number;
    /** Where history comes from (default: the hot log); readLog reaches into Postgres. */
    read?: (after: number, limit: number) => Promise<LogEvent[]>;
    /**
     * Where live batches come from (default: the log's feed of the tenant), with its promise.
     * It may resolve to nothing when the caller ends the subscription itself (with the sink
     * it was handed): follow() then resolves to a function that does nothing.
     */
    subscribe?: (sink: BatchSink) => Promise<(() => void) | undefined>;
    /**
     * Paces history by the reader: awaited before each page after the first (a watcher's
     * socket draining), so a long replay holds at most a page in memory however slow the client.
     */
    paced?: () => Promise<void> | undefined;
    /** True once nobody waits for the history any more (the watcher left): reading stops. */
    cancelled?: () => boolean;
  } = {},
): Promise<() => void> {
  const pageSize = options.pageSize ?? 1000;
  const read = options.read ?? ((from: number, limit: number) => log.read(tenant, { after: from, limit }));
  const joined = new Joined(after === 'now' ? Number.MAX_SAFE_INTEGER : after, sink);
  const stop =
    (await (options.subscribe ? options.subscribe(joined) : log.subscribe(tenant, (batch) => joined.onBatch(batch)))) ??
    nothing;
  if (after === 'now') {
    joined.last = await log.lastId(tenant);
    options.onStart?.(joined.last);
    joined.goLive();
    return stop;
  }
  // The next page is asked for before this one is delivered, so the store works on it while
  // this process frames and writes the current one (the two are on different cores).
  let next = read(joined.last, pageSize);
  for (;;) {
    const page = await next;
    if (page.length === 0 || options.cancelled?.()) break;
    const full = page.length >= pageSize;
    if (full) next = read((page.at(-1) as LogEvent).id, pageSize);
    joined.emit(page);
    if (!full) break;
    const paced = options.paced?.();
    if (paced) await paced;
    if (options.cancelled?.()) {
      next.catch(() => {}); // the page read ahead is not wanted
      break;
    }
  }
  // Live starts once the reader took its history: what it is sent live is then judged on its own.
  const paced = options.cancelled?.() ? undefined : options.paced?.();
  if (paced) await paced;
  joined.goLive();
  return stop;
}

/**
 * A watcher's place in the log while it joins and after. A class rather than closures: a
 * node holds one per watcher for as long as it watches, and methods live once on the
 * prototype (tsx names every closure it creates, which costs each a property store).
 */
class Joined implements BatchSink {
  private live = false;
  /** What arrived live while history was read; gone once live. */
  private buffered: LogEvent[][] | undefined = [];
  constructor(
    public last: number,
    private readonly sink: EventSink,
  ) {}

  onBatch(batch: LiveBatch): void {
    if (this.live) this.emit(batch.events);
    else this.buffered?.push(batch.events);
  }

  emit(events: LogEvent[]): void {
    const last = this.last;
    // The common case, a live batch wholly after what was delivered, is passed on as it is.
    const fresh = events.length > 0 && (events[0] as LogEvent).id > last ? events : events.filter((e) => e.id > last);
    if (fresh.length === 0) return;
    this.last = (fresh.at(-1) as LogEvent).id;
    this.sink.onEvents(fresh);
  }

  goLive(): void {
    for (const events of this.buffered ?? []) this.emit(events);
    this.buffered = undefined;
    this.live = true;
  }
}
