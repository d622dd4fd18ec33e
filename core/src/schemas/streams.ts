import { z } from 'zod';
import { LOG_STREAMS } from './conversations.ts';

/** The `streams` filter: comma-separated log stream names; absent or empty, every stream. */
const StreamsFilter = z
  .string()
  .refine((s) => s === '' || s.split(',').every((x) => (LOG_STREAMS as readonly string[]).includes(x.trim())), {
    message: `streams is a list of ${LOG_STREAMS.join(', ')}.`,
  })
  .optional();

const Blocks = z.string().optional().meta({ description: '`true`: add the parsed blocks to each event.' });

const LastEventIdQuery = z
  .string()
  .optional()
  .meta({ description: 'For clients that cannot set the Last-Event-ID header: resume after this event id.' });

/** The `streams` filter as a list (undefined: every stream). */
export function streamList(streams: string | undefined): string[] | undefined {
  return streams ? streams.split(',').map((x) => x.trim()) : undefined;
}

/**
 * The query of `GET /api/conversations/:id/stream`, as the stream reads it and as the API
 * description shows it. Flags are `true` or not: any other value means false, as it always has.
 */
export const ConversationStreamQuery = z.object({
  streams: StreamsFilter.meta({ description: `Comma-separated: ${LOG_STREAMS.join(', ')}.` }),
  wait: z.string().optional().meta({
    description:
      '`true`: stay open across turns until the conversation terminates; otherwise the response ends once the conversation has no running turn.',
  }),
  blocks: Blocks,
  last_event_id: LastEventIdQuery,
});
export type ConversationStreamQuery = z.infer<typeof ConversationStreamQuery>;

/** The query of `GET /api/events/stream` and `GET /api/team/stream`. */
export const MultiplexedStreamQuery = z.object({
  streams: StreamsFilter.meta({
    description: `Comma-separated: ${LOG_STREAMS.join(', ')} (change events always pass).`,
  }),
  blocks: Blocks,
  last_event_id: LastEventIdQuery,
});
export type MultiplexedStreamQuery = z.infer<typeof MultiplexedStreamQuery>;
