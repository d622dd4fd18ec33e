import type { EventLog, LogEvent } from './log.ts';

/**
 * Joins a watcher to a tenant's log without a gap (DESIGN.md "Live delivery"): subscribe
 * first and buffer what arrives, read the history after `after` and deliver it, then drain
 * the buffer dropping every id already delivered, then deliver live. `onEvents` sees every
 * event after `after` exactly once, in id order. Resolves to the function that stops it.
 */
export async function follow(
  log: EventLog,
  tenant: string,
  after: number,
  onEvents: (events: LogEvent[]) => void,
  options: {
    pageSize?: number;
    /** Where history comes from (default: the hot log); readLog reaches into Postgres. */
    read?: (after: number, limit: number) => Promise<LogEvent[]>;
  } = {},
): Promise<() => void> {
  const pageSize = options.pageSize ?? 1000;
  const read = options.read ?? ((from: number, limit: number) => log.read(tenant, { after: from, limit }));
  let last = after;
  let live = false;
  const buffered: LogEvent[][] = [];
  const emit = (events: LogEvent[]) => {
    const fresh = events.filter((e) => e.id > last);
    if (fresh.length === 0) return;
    last = (fresh.at(-1) as LogEvent).id;
    onEvents(fresh);
  };
  const stop = await log.subscribe(tenant, (batch) => {
    if (live) emit(batch.events);
    else buffered.push(batch.events);
  });
  // The next page is asked for before this one is delivered, so the store works on it while
  // this process frames and writes the current one (the two are on different cores).
  let next = read(last, pageSize);
  for (;;) {
    const page = await next;
    if (page.length === 0) break;
    const full = page.length >= pageSize;
    if (full) next = read((page.at(-1) as LogEvent).id, pageSize);
    emit(page);
    if (!full) break;
  }
  for (const events of buffered) emit(events);
  buffered.length = 0;
  live = true;
  return stop;
}
