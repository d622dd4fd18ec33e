import { logEvents, type Sql } from '@svc/db';
import type { EventLog, LogEvent, ReadOptions } from './log.ts';

/**
 * Reads a tenant's (or a conversation's) events after `after`, oldest first, from wherever
 * they are. The hot log answers alone when it still holds the event `after` itself: it is
 * only ever trimmed from below and read in one snapshot, so holding that event means it holds
 * everything after it. That is the usual case for a reader resuming from its Last-Event-ID,
 * and Postgres is then not asked at all (DESIGN.md invariant 5: the durable copy is read only
 * for what the hot log no longer has). An `after` of 0, an id the hot log has dropped, or one
 * it never had (it lost its data) falls back to the durable copy.
 *
 * The fallback: Postgres holds everything up to the copy mark, and the hot log is only ever
 * trimmed below that mark, so Postgres up to the mark followed by the hot log above it is
 * complete, without a hole between the two. The copier may move the mark and trim while a
 * read is under way; then the hot log may no longer hold the start of the range the old mark
 * left to it. The trim point is set before events go, so a hot read followed by a trim point
 * above where it started means the read may have a hole, and it is done again against the new
 * mark.
 */
export async function readLog(
  deps: { sql: Sql; log: EventLog },
  tenant: string,
  o: ReadOptions,
  /**
   * `durableFirst`: read what the copy holds from the copy, whatever the hot log still has (an
   * export: the copy no longer holds a deleted conversation's events, the hot tail may).
   */
  how: { durableFirst?: boolean } = {},
): Promise<LogEvent[]> {
  if (o.after > 0 && !how.durableFirst) {
    // Ids are whole numbers: from `after - 1` the first event is `after` when it is still held.
    const hot = await deps.log.read(tenant, { ...o, after: o.after - 1, limit: o.limit + 1 });
    if (hot[0]?.id === o.after) return hot.slice(1);
  }
  for (;;) {
    const mark = await logEvents.copiedUpTo(deps.sql, tenant);
    const out: LogEvent[] = [];
    let after = o.after;
    if (after < mark) {
      const stored = await logEvents.readStored(deps.sql, tenant, {
        after,
        upTo: mark,
        limit: o.limit,
        conversationId: o.conversationId,
      });
      out.push(...stored);
      if (out.length >= o.limit) return out;
      after = mark;
    }
    const hot = await deps.log.read(tenant, { ...o, after, limit: o.limit - out.length });
    if ((await deps.log.floor(tenant)) > after + 1) continue;
    out.push(...hot);
    return out;
  }
}
