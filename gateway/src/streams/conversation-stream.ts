import { ApiError, ConversationStreamQuery, streamList } from '@svc/core';
import { conversations } from '@svc/db';
import { follow } from '../log/follow.ts';
import type { LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { shapeEvent } from '../services/conversations.ts';
import type { ConversationFeeds } from './conversation-feeds.ts';
import { cachedFrame, frame } from './framing.ts';
import type { Opening, StreamResponse } from './response.ts';
import type { StreamDeps, WatcherRegistry } from './watchers.ts';

const TURN_ENDS = new Set(['done', 'failed', 'interrupted', 'timeout']);

/**
 * `GET /api/conversations/:id/stream`: one conversation's events after Last-Event-ID, then
 * live without a gap. `wait=false` (default) ends the response once the conversation has no
 * running turn; `wait=true` stays open across turns until the conversation terminates or the
 * idle close. Another tenant's conversation is 404 before any byte of stream; the
 * conversation's own sandbox token may watch it.
 */
export function serveConversationStream(
  deps: StreamDeps,
  registry: WatcherRegistry,
  feeds: ConversationFeeds,
  res: StreamResponse,
  opening: Opening,
  conversationId: string,
): void {
  registry.open(
    res,
    opening,
    ConversationStreamQuery,
    async ({ w, principal, query, after }) => {
      const wait = query.wait === 'true';
      const withBlocks = query.blocks === 'true';
      const streams = streamList(query.streams);
      const tenant = principal.accountId;
      // Live: a turn's end closes a wait=false stream, the conversation's end closes any.
      let replaying = true;
      const onEvents = (events: LogEvent[]) => {
        if (w.closed) return;
        let frames = '';
        let alone: Buffer | undefined;
        let count = 0;
        let last = 0;
        let ending = false;
        for (const e of events) {
          w.position = Math.max(w.position, e.id);
          if (e.conversationId !== conversationId) continue;
          if (!streams || streams.includes(e.stream)) {
            // History read for this watcher is its own: caching its frames would only fill the
            // cache (and the collector's work) with entries nobody else meets.
            if (replaying) {
              frames += frame(e.id, shapeEvent(e, withBlocks));
              alone = undefined;
            } else {
              const f = cachedFrame(`conversation:${withBlocks}`, e, () => frame(e.id, shapeEvent(e, withBlocks)));
              frames += f.text;
              alone = f.bytes;
            }
            count++;
            last = e.id;
          }
          if (e.kind === 'stage' && !replaying) {
            if (e.stage === 'terminate' && e.state === 'done') ending = true;
            if (!wait && e.stage === 'turn' && TURN_ENDS.has(e.state ?? '')) ending = true;
          }
        }
        if (count > 0) registry.sendEvents(w, count === 1 && alone ? alone : frames, last);
        if (ending) registry.end(w);
      };
      w.stop = await follow(deps.log, tenant, after, onEvents, {
        read: (from, limit) => readLog(deps, tenant, { conversationId, after: from, limit }),
        subscribe: (onBatch) => feeds.subscribe(tenant, conversationId, onBatch),
        paced: () => registry.drained(w),
        cancelled: () => w.closed,
      });
      if (w.closed) return w.stop();
      replaying = false;
      w.replaying = false;
      // History is out. wait=false ends now unless a turn is running; a terminated
      // conversation has nothing more to say either way.
      const now = await conversations.getConversation(deps.sql, tenant, conversationId);
      if (!now || now.status === 'terminated' || (!wait && now.status !== 'running')) registry.end(w);
    },
    {
      sandbox: conversationId,
      prepare: async (principal) => {
        if (!(await conversations.getConversation(deps.sql, principal.accountId, conversationId))) {
          throw new ApiError('not_found', 'Conversation not found.');
        }
      },
    },
  );
}
