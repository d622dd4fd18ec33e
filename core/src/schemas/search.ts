import { z } from 'zod';
import { Timestamp } from './common.ts';

/** Where a search hit was found (SPEC "Search hit"). */
export const SEARCH_KINDS = ['title', 'prompt', 'reply'] as const;
export const SearchKind = z.enum(SEARCH_KINDS);
export type SearchKind = z.infer<typeof SearchKind>;

export const SearchHit = z
  .object({
    kind: SearchKind.meta({
      description: 'The conversation’s title, a turn’s prompt, or a turn’s reply (stored when the turn ends).',
    }),
    conversation_id: z.string(),
    agent_id: z.string(),
    turn_id: z.string().nullable().meta({ description: 'Null for a title hit.' }),
    turn_number: z.int().nullable().meta({ description: 'Null for a title hit.' }),
    snippet: z.string().meta({
      description:
        'Plain text around the first matched word, with `…` where the text was cut: no markup is added, and markup in the text itself comes back as the characters it is.',
    }),
    ts: Timestamp.meta({ description: 'When the turn, or for a title the conversation, was created.' }),
  })
  .meta({ id: 'SearchHit' });

export const SearchQuery = z.object({
  q: z.string({ error: 'is required: the words to search for' }).max(1000).meta({
    description:
      'Web-search syntax: words (all must match), a "quoted phrase", `-word` to exclude, `or` between alternatives. Exact tokens, any case, no stemming.',
  }),
  kinds: z
    .string()
    .optional()
    .meta({ description: 'Comma list of `title`, `prompt`, `reply`; all three when absent.' }),
  agent_id: z.string().max(100).optional(),
  conversation_id: z.string().max(100).optional(),
  since: z
    .string()
    .optional()
    .meta({ description: 'ISO 8601; hits whose turn or conversation was created at or after it.' }),
  limit: z.coerce.number().int().min(1).max(100).default(20),
  offset: z.coerce.number().int().min(0).default(0),
});

export type SearchQuery = z.output<typeof SearchQuery>;

export const SearchPage = z.object({
  data: z.array(SearchHit),
  meta: z.object({ limit: z.int(), offset: z.int(), has_more: z.boolean() }),
});
