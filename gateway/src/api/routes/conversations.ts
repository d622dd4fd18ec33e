import {
  Conversation,
  ConversationCreate,
  ConversationQuery,
  ErrorBody,
  EventsPage,
  EventsQuery,
  IdParam,
  listOf,
  TreeEntry,
  Turn,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import * as convs from '../../services/conversations.ts';
import { startConversation } from '../../services/launch.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['conversations'];

export function conversationRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };

  r.get('/api/conversations', {
    config,
    schema: {
      tags,
      summary: 'List conversations, most recently active first',
      description:
        'Filters combine with roots_only. A status outside idle, running, terminated is 400 `invalid_status`.',
      querystring: ConversationQuery,
      response: { 200: listOf(Conversation), 400: ErrorBody },
    },
    handler: async (req) => ({
      data: (await convs.listConversations(deps.sql, requirePrincipal(req).accountId, req.query)).map(
        convs.shapeConversation,
      ),
    }),
  });

  r.post('/api/conversations', {
    config,
    schema: {
      tags,
      summary: 'Start a conversation: build its sandbox and run the first prompt',
      description:
        'The agent runs on a sandbox of its provider (`runner`: one of the account’s online runners). The answer comes once the conversation, its sandbox and first turn are recorded; the build and the turn follow in the log (watch `/api/conversations/:id/stream`). 409 `no_runner_online` when no runner of the account is connected; 422 `missing_credential` when the model provider has no inference credential; 422 `validation_failed` for an environment or vault outside the agent’s allowlists; 429 `sandbox_quota_exceeded` (body: `active`, `limit`) when the account holds SANDBOX_QUOTA_DEFAULT active sandboxes; 503 `fleet_full` when the instance holds FLEET_MAX_SANDBOXES. Both carry Retry-After and create nothing.',
      body: ConversationCreate,
      response: { 201: Conversation, 404: ErrorBody, 409: ErrorBody, 422: ErrorBody, 429: ErrorBody, 503: ErrorBody },
    },
    handler: async (req, reply) => {
      const row = await startConversation(deps.launch, actorOf(requirePrincipal(req)), req.body);
      return reply.code(201).send(convs.shapeConversation(row));
    },
  });

  r.get('/api/conversations/:id', {
    config,
    schema: { tags, summary: 'One conversation', params: IdParam, response: { 200: Conversation, 404: ErrorBody } },
    handler: async (req) =>
      convs.shapeConversation(await convs.getConversation(deps.sql, requirePrincipal(req).accountId, req.params.id)),
  });

  r.delete('/api/conversations/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete a conversation with its turns and log',
      params: IdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await convs.deleteConversation(deps.sql, actorOf(requirePrincipal(req)), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.post('/api/conversations/:id/read', {
    config,
    schema: { tags, summary: 'Clear unread', params: IdParam, response: { 200: Conversation, 404: ErrorBody } },
    handler: async (req) =>
      convs.shapeConversation(await convs.markRead(deps.sql, actorOf(requirePrincipal(req)), req.params.id)),
  });

  r.get('/api/conversations/:id/turns', {
    config,
    schema: { tags, summary: 'Turns, oldest first', params: IdParam, response: { 200: listOf(Turn), 404: ErrorBody } },
    handler: async (req) => ({ data: await convs.listTurns(deps.sql, requirePrincipal(req).accountId, req.params.id) }),
  });

  r.get('/api/conversations/:id/tree', {
    config,
    schema: {
      tags,
      summary: 'The whole spawn tree, flat: ancestors and descendants',
      params: IdParam,
      response: { 200: listOf(TreeEntry), 404: ErrorBody },
    },
    handler: async (req) => ({ data: await convs.spawnTree(deps.sql, requirePrincipal(req).accountId, req.params.id) }),
  });

  r.get('/api/conversations/:id/events', {
    config,
    schema: {
      tags,
      summary: 'The log as JSON pages, oldest first',
      description:
        'Page by passing `meta.next_cursor` as `after` while `has_more` is true. `limit` default 100, max 1000.',
      params: IdParam,
      querystring: EventsQuery,
      response: { 200: EventsPage, 404: ErrorBody },
    },
    handler: async (req) =>
      convs.conversationEvents(
        { sql: deps.sql, log: deps.eventLog },
        requirePrincipal(req).accountId,
        req.params.id,
        req.query,
      ),
  });
}
