import { serveConversationStream } from './conversation-stream.ts';
import { ConversationDirectory } from './directory.ts';
import { LiveFeeds } from './live-feeds.ts';
import { EVENTS_STREAM, type MultiplexedContext, serveMultiplexed, TEAM_STREAM } from './multiplexed.ts';
import type { Opening, StreamResponse } from './response.ts';
import { type StreamDeps, WatcherRegistry } from './watchers.ts';

/** The paths of the three streams, as transports register them (`:id` is the conversation). */
export const STREAM_PATHS = {
  conversation: '/api/conversations/:id/stream',
  events: EVENTS_STREAM.path,
  team: TEAM_STREAM.path,
} as const;

/**
 * Server-Sent Events of a node (SPEC "Stream events"), whichever server carries them: the
 * edge (uWS) in production, the api role's Fastify when it serves alone. A transport reads
 * the request into an Opening, wraps its response in a StreamResponse and calls one method.
 *
 * - `conversation`: one conversation's events (conversation-stream.ts).
 * - `events`: every conversation of the caller, with `conversation_id`, and `conversations`
 *   `{reason: changed}` at most once a second.
 * - `team`: the team channel's conversations, with `conversation_id` and `agent_id`, and
 *   `team` / `schedule` `{reason: changed}`.
 *
 * Each replays after `Last-Event-ID` (header, or `last_event_id` in the query for clients
 * that cannot set headers) and then follows live without a gap (follow()). A heartbeat
 * comment carries `id: <position>` when the watcher has been brought past the last id it was
 * told (its filters skipped events), so a reconnect does not start from far back.
 */
export class StreamServer {
  private readonly registry: WatcherRegistry;
  private readonly feeds: LiveFeeds;
  private readonly multiplexed: MultiplexedContext;

  constructor(private readonly deps: StreamDeps) {
    this.registry = new WatcherRegistry(deps);
    this.feeds = new LiveFeeds(deps.log);
    this.multiplexed = {
      deps,
      registry: this.registry,
      directory: new ConversationDirectory(deps.sql),
      feeds: this.feeds,
    };
  }

  conversation(res: StreamResponse, opening: Opening, conversationId: string): void {
    serveConversationStream(this.deps, this.registry, this.feeds, res, opening, conversationId);
  }

  events(res: StreamResponse, opening: Opening): void {
    serveMultiplexed(this.multiplexed, EVENTS_STREAM, res, opening);
  }

  team(res: StreamResponse, opening: Opening): void {
    serveMultiplexed(this.multiplexed, TEAM_STREAM, res, opening);
  }

  /** Ends the account's open streams on this node (WatcherRegistry.endAccount); returns how many. */
  endAccount(accountId: string): number {
    return this.registry.endAccount(accountId);
  }

  /** Ends every open stream; clients reconnect (to another node) with Last-Event-ID. */
  close(): void {
    this.registry.close();
  }

  get watchers(): number {
    return this.registry.size;
  }
}
