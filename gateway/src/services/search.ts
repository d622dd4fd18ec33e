import { ApiError, SEARCH_KINDS, type SearchQuery } from '@svc/core';
import { type Sql, search } from '@svc/db';
import { parseInstant } from './audit.ts';
import { csv } from './list-params.ts';

/**
 * The tenant's hits for `q` (SPEC "Search"), best first, newest first among equals. A blank
 * `q`, an unknown kind, a malformed `since`, and a query that only excludes words (it names
 * nothing to find, and would match nearly everything) are 400 `invalid_request`. A query
 * with no words at all (only punctuation) finds nothing.
 */
export async function searchTenant(sql: Sql, accountId: string, query: SearchQuery) {
  const q = query.q.trim();
  if (q === '') throw new ApiError('invalid_request', 'q must hold the words to search for.');
  const kinds =
    csv(
      query.kinds,
      SEARCH_KINDS,
      () => new ApiError('invalid_request', `kinds must be a comma list of ${SEARCH_KINDS.join(', ')}.`),
    ) ?? SEARCH_KINDS;
  const since = parseInstant('since', query.since);
  const page = { limit: query.limit, offset: query.offset };

  const parsed = await search.parseQuery(sql, q);
  if (!parsed.hasWords) return { data: [], meta: { ...page, has_more: false } };
  if (parsed.required.length === 0) {
    throw new ApiError('invalid_request', 'q must name at least one word to find; a leading minus only excludes.');
  }
  const rows = await search.searchHits(sql, accountId, q, parsed.required, {
    kinds,
    agentId: query.agent_id,
    conversationId: query.conversation_id,
    since,
    ...page,
  });
  return {
    data: rows.slice(0, query.limit).map((r) => ({
      kind: r.kind,
      conversation_id: r.conversation_id,
      agent_id: r.agent_id,
      turn_id: r.turn_id,
      turn_number: r.turn_number,
      snippet: snippetOf(r.excerpt, r.cut_before, r.cut_after),
      ts: r.ts.toISOString(),
    })),
    meta: { ...page, has_more: rows.length > query.limit },
  };
}

/**
 * A one-line snippet from an excerpt of a longer text (search.searchHits): runs of white space
 * become one space, a word the cut may have split at either end is dropped when that leaves
 * the matched word whole, and `…` marks each end where the text goes on. The text's characters
 * are kept as they are, markup included: nothing is added but spaces and `…`.
 */
export function snippetOf(excerpt: string, cutBefore: boolean, cutAfter: boolean): string {
  let text = excerpt;
  // A cut before means the matched word starts EXCERPT_BEFORE characters in.
  if (cutBefore) {
    const space = text.search(/\s/);
    if (space >= 0 && space < search.EXCERPT_BEFORE) text = text.slice(space);
  }
  if (cutAfter) {
    const space = text.search(/\s\S*$/);
    if (space > (text.length * 3) / 4) text = text.slice(0, space);
  }
  text = text.replace(/\s+/g, ' ').trim();
  return `${cutBefore ? '…' : ''}${text}${cutAfter ? '…' : ''}`;
}
