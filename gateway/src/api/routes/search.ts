import { ErrorBody, SearchPage, SearchQuery } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { searchTenant } from '../../services/search.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

export function searchRoutes(app: FastifyInstance, deps: ApiDeps): void {
  app.withTypeProvider<ZodTypeProvider>().get('/api/search', {
    config: { auth: 'user' },
    schema: {
      tags: ['search'],
      summary: "Full-text search of the account's conversation titles, prompts and replies",
      operationId: 'search',
      description: [
        'Postgres full text with the `simple` configuration: exact tokens in any case, no stemming.',
        '`q` takes web-search syntax: words that must all appear, a "quoted phrase", `-word` to exclude a word, `or` between alternatives.',
        'Hits are ranked (`ts_rank`), newest first among equals; `meta.has_more` says whether `offset + limit` holds more.',
        'A reply is stored when its turn ends, so a running turn is found by its prompt only.',
        '400 `invalid_request` for a missing or blank `q`, a `q` that only excludes words, a kind outside `title,prompt,reply`, or a malformed `since`.',
      ].join(' '),
      querystring: SearchQuery,
      response: { 200: SearchPage, 400: ErrorBody, 401: ErrorBody },
    },
    handler: async (req) => searchTenant(deps.sql, requirePrincipal(req).accountId, req.query),
  });
}
