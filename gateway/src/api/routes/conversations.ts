import {
  Conversation,
  ConversationCreate,
  ConversationQuery,
  ErrorBody,
  EventsPage,
  EventsQuery,
  IdParam,
  listOf,
  PromptCreate,
  TreeEntry,
  Turn,
  TurnImageParams,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import * as convs from '../../services/conversations.ts';
import {
  interruptConversation,
  removeConversation,
  sendPrompt,
  startConversation,
  terminateConversation,
} from '../../services/launch.ts';
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
      errors: ['invalid_status'],
      response: { 200: listOf(Conversation), 400: ErrorBody },
    },
    handler: async (req) => ({
      data: (await convs.listConversations(deps.sql, requirePrincipal(req).accountId, req.query)).map(
        convs.shapeConversation,
      ),
    }),
  });

  r.post('/api/conversations', {
    // A sandbox token reaches this route only to start sub-conversations of its conversation.
    config: { ...config, sprite: true },
    schema: {
      tags,
      summary: 'Start a conversation: build its sandbox and run the first prompt',
      description:
        'The agent runs on a sandbox of its provider (`local`: a runner-agent the instance starts; `runner`: one of the account’s online runners). The answer comes once the conversation, its sandbox and first turn are recorded; the build and the turn follow in the log (watch `/api/conversations/:id/stream`). `sandbox_id` attaches to an existing sandbox: 404 `sandbox_not_found`, 409 `sandbox_not_attachable` unless it is ready or suspended, 422 `sandbox_identity_mismatch` unless it was built for the same agent, environment and vault. A persistent launch (`sandbox_mode` or the agent’s default) runs on the identity’s own machine, made on the first such launch; 503 `provisioning` while it is being built. 409 `no_runner_online` when provider `runner` has no connected runner; 429 `sandbox_quota_exceeded` (body: `active`, `limit`) when the account holds SANDBOX_QUOTA_DEFAULT active sandboxes; 503 `fleet_full` when the instance holds FLEET_MAX_SANDBOXES (both with Retry-After, creating nothing); 422 `missing_credential` when the model provider has no inference credential; 422 `validation_failed` for an environment or vault outside the agent’s allowlists. With payment on, 402 `insufficient_credits` (body: `upgrade_url`) when the account is not comped and its credit is zero or below, or its month reached the spending cap. A sandbox token (in the runtime as `SVC_SANDBOX_TOKEN`, with `SVC_API_URL` and `SVC_CONVERSATION_ID`) may call this only with `X-Svc-Parent-Conversation-Id` naming its own conversation (403 otherwise).',
      headers: z.object({
        'x-svc-parent-conversation-id': z.string().min(1).max(64).optional().meta({
          description:
            'Start a sub-conversation under this conversation (it appears in its /tree). A sandbox token may start one only under its own conversation.',
        }),
      }),
      body: ConversationCreate,
      errors: [
        'not_found',
        'sandbox_not_found',
        'no_runner_online',
        'sandbox_not_attachable',
        'unsupported_media_type',
        'sandbox_identity_mismatch',
        'missing_credential',
        'sandbox_quota_exceeded',
        'fleet_full',
        'provisioning',
        'runner_offline',
        'insufficient_credits',
      ],
      response: {
        201: Conversation,
        403: ErrorBody,
        404: ErrorBody,
        409: ErrorBody,
        413: ErrorBody,
        415: ErrorBody,
        422: ErrorBody,
        429: ErrorBody,
        503: ErrorBody,
      },
    },
    handler: async (req, reply) => {
      const principal = requirePrincipal(req);
      const row = await startConversation(
        deps.launch,
        { ...actorOf(principal), conversationId: principal.conversationId },
        req.body,
        req.headers['x-svc-parent-conversation-id'] ?? null,
      );
      return reply.code(201).send(convs.shapeConversation(row));
    },
  });

  r.get('/api/conversations/:id', {
    config,
    schema: {
      tags,
      summary: 'One conversation',
      description:
        "Its status (idle, running, terminated), agent, sandbox, title and unread state. 404 for an unknown conversation or another account's.",
      operationId: 'getConversation',
      params: IdParam,
      response: { 200: Conversation, 404: ErrorBody },
    },
    handler: async (req) =>
      convs.shapeConversation(await convs.getConversation(deps.sql, requirePrincipal(req).accountId, req.params.id)),
  });

  r.delete('/api/conversations/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete a conversation with its turns and log',
      description:
        'A live conversation is terminated first: its running turn stops and its ephemeral sandbox is destroyed.',
      params: IdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await removeConversation(deps.launch, actorOf(requirePrincipal(req)), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.post('/api/conversations/:id/read', {
    config,
    schema: {
      tags,
      summary: 'Clear unread',
      description:
        'Marks the conversation read and answers it; watchers of /api/events/stream get a `conversations` event.',
      operationId: 'markConversationRead',
      params: IdParam,
      response: { 200: Conversation, 404: ErrorBody },
    },
    handler: async (req) =>
      convs.shapeConversation(await convs.markRead(deps.sql, actorOf(requirePrincipal(req)), req.params.id)),
  });

  r.get('/api/conversations/:id/turns', {
    config,
    schema: {
      tags,
      summary: 'Turns, oldest first',
      description:
        "Each turn with its result: `reply` (the agent's answer, stored when the turn ends), `ended_at`, and `error` `{code, message}` on a failed turn, saying what to fix (`invalid_api_key`, `provider_unreachable`, `provider_error`, `agent_not_installed`, `agent_crashed`, `sandbox_failed`, `runner_offline`).",
      operationId: 'listConversationTurns',
      params: IdParam,
      response: { 200: listOf(Turn), 404: ErrorBody },
    },
    handler: async (req) => ({ data: await convs.listTurns(deps.sql, requirePrincipal(req).accountId, req.params.id) }),
  });

  r.post('/api/conversations/:id/prompts', {
    config,
    schema: {
      tags,
      summary: 'Send the next prompt: a follow-up turn',
      operationId: 'sendPrompt',
      description:
        'Answers 201 with the new turn once it is recorded; the turn runs on the conversation’s sandbox and its output follows in the log. 400 `conversation_busy` while a turn runs (an autonomous turn, opened for output the agent sent after answering, is not refused but ended `done` first); 409 `sandbox_at_capacity` while another conversation runs a turn on the same opencode or gemini sandbox; 410 `conversation_terminated` after terminate; 503 `runner_offline` when the runner the sandbox lives on is not connected (nothing is recorded then). A sandbox whose machine is gone (failed) is built again for the same agent, environment and vault before the turn. With payment on, 402 `insufficient_credits` (body: `upgrade_url`) when the account is not comped and its credit is zero or below, or its month reached the spending cap.',
      params: IdParam,
      body: PromptCreate,
      errors: [
        'conversation_busy',
        'not_found',
        'sandbox_at_capacity',
        'conversation_terminated',
        'unsupported_media_type',
        'missing_credential',
        'provisioning',
        'runner_offline',
        'insufficient_credits',
      ],
      response: {
        201: Turn,
        400: ErrorBody,
        404: ErrorBody,
        409: ErrorBody,
        410: ErrorBody,
        413: ErrorBody,
        415: ErrorBody,
        422: ErrorBody,
        503: ErrorBody,
      },
    },
    handler: async (req, reply) => {
      const turn = await sendPrompt(deps.launch, actorOf(requirePrincipal(req)), req.params.id, req.body);
      return reply.code(201).send(convs.shapeTurn(turn));
    },
  });

  r.post('/api/conversations/:id/interrupt', {
    config,
    schema: {
      tags,
      summary: 'Stop the running turn; the sandbox stays up',
      description:
        'The turn ends `interrupted` (its `turn` stage event follows in the log as the runtime stops). With no turn running there is nothing to stop and the conversation is answered as it is. When the runner is not connected the turn is ended here. 410 `conversation_terminated` after terminate.',
      params: IdParam,
      errors: ['conversation_terminated'],
      response: { 200: Conversation, 404: ErrorBody, 410: ErrorBody },
    },
    handler: async (req) =>
      convs.shapeConversation(await interruptConversation(deps.launch, actorOf(requirePrincipal(req)), req.params.id)),
  });

  r.post('/api/conversations/:id/terminate', {
    config,
    schema: {
      tags,
      summary: 'End the conversation',
      description:
        'A running turn ends `interrupted`, the runtime stops, and the sandbox is destroyed unless it is persistent or another live conversation shares it. The conversation stays listed with status `terminated`; later prompts, interrupts and terminates answer 410 `conversation_terminated`.',
      params: IdParam,
      errors: ['conversation_terminated'],
      response: { 200: Conversation, 404: ErrorBody, 410: ErrorBody },
    },
    handler: async (req) =>
      convs.shapeConversation(await terminateConversation(deps.launch, actorOf(requirePrincipal(req)), req.params.id)),
  });

  r.get('/api/conversations/:id/turns/:turn_id/images/:position', {
    config,
    schema: {
      tags,
      summary: 'An image sent with a turn’s prompt, by zero-based position',
      description:
        'The raw bytes with their stored media type. 404 for an unknown conversation, a turn of another conversation, or a position with no image.',
      params: TurnImageParams,
      response: { 404: ErrorBody },
    },
    handler: async (req, reply) => {
      const image = await convs.turnImage(deps.sql, requirePrincipal(req).accountId, req.params);
      return (
        reply
          .type(image.media_type)
          .header('x-content-type-options', 'nosniff')
          .header('content-security-policy', "default-src 'none'; sandbox")
          .header('cache-control', 'private, max-age=3600')
          // Bytes, not JSON: the response schema describes only errors, so the type is widened here.
          .send(Buffer.from(image.data) as never)
      );
    },
  });

  r.get('/api/conversations/:id/tree', {
    config,
    schema: {
      tags,
      summary: 'The whole spawn tree, flat: ancestors and descendants',
      description:
        'The conversation, the conversations it was started from, and every sub-conversation started under it or its descendants, each with its parent.',
      operationId: 'getConversationTree',
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
