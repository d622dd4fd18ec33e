import { type Sql, search } from '@svc/db';
import type { EventLog } from '../log/log.ts';
import { replyOf } from './turns.ts';

/**
 * The one-time reply backfill (SPEC "Search"): turns that ended before replies were stored
 * at turn end have none, so search finds them by prompt only. This reads each one's reply
 * from the log, exactly as a turn's end does (`replyOf`), and stores it; a turn whose log
 * holds no agent text gets an empty reply, so it is not looked at again. Idempotent and safe
 * to run on several nodes at once: a reply is only ever written where none is stored. Stops
 * between turns when `signal` is aborted. Resolves to how many turns it filled.
 */
export async function backfillReplies(
  deps: { sql: Sql; log: EventLog },
  options: { batch?: number; signal?: AbortSignal } = {},
): Promise<number> {
  const batch = options.batch ?? 100;
  let filled = 0;
  let after = '';
  for (;;) {
    const turns = await search.turnsWithoutStoredReply(deps.sql, after, batch);
    for (const turn of turns) {
      if (options.signal?.aborted) return filled;
      const reply = await replyOf(deps, turn.account_id, turn.conversation_id, turn.id);
      if (await search.storeMissingReply(deps.sql, turn.account_id, turn.id, reply)) filled++;
    }
    if (turns.length < batch) return filled;
    after = (turns.at(-1) as { id: string }).id;
  }
}
