import {
  Agent,
  AgentCreate,
  AgentPatch,
  AgentQuery,
  ApiError,
  AvatarJson,
  ErrorBody,
  IdParam,
  listOf,
  validationFailed,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { shapeAgent } from '../../services/agent-shape.ts';
import * as agents from '../../services/agents.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['agents'];

export async function agentRoutes(app: FastifyInstance, deps: ApiDeps): Promise<void> {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };

  r.get('/api/agents', {
    config,
    schema: {
      tags,
      summary: 'List agents',
      description:
        'Filters combine: `search` matches name and description, `runtime` and `environment_id` match exactly, `has_skills` and `has_mcp` take true or false.',
      operationId: 'listAgents',
      querystring: AgentQuery,
      response: { 200: listOf(Agent) },
    },
    handler: async (req) => ({
      data: (await agents.listAgents(deps.sql, requirePrincipal(req).accountId, req.query)).map(shapeAgent),
    }),
  });

  r.post('/api/agents', {
    config,
    schema: {
      tags,
      summary: 'Create an agent',
      description:
        "The provider of `model` must belong to the runtime (claude: anthropic, codex: openai, gemini: google, opencode: any catalog provider); the model itself is never checked against a list. `sandbox_provider` must be one this instance offers (`sandbox_providers` in GET /api/catalog), or null for the instance default; another is 422 `validation_failed`. Referenced environments and vaults must be the caller's (404 otherwise).",
      body: AgentCreate,
      response: { 201: Agent, 404: ErrorBody, 422: ErrorBody },
    },
    handler: async (req, reply) =>
      reply
        .code(201)
        .send(
          shapeAgent(
            await agents.createAgent(deps.sql, actorOf(requirePrincipal(req)), req.body, deps.launch.providers),
          ),
        ),
  });

  r.get('/api/agents/:id', {
    config,
    schema: {
      tags,
      summary: 'One agent',
      description: "404 for an unknown agent or another account's.",
      operationId: 'getAgent',
      params: IdParam,
      response: { 200: Agent, 404: ErrorBody },
    },
    handler: async (req) => shapeAgent(await agents.getAgent(deps.sql, requirePrincipal(req).accountId, req.params.id)),
  });

  for (const method of ['PUT', 'PATCH'] as const) {
    r.route({
      method,
      url: '/api/agents/:id',
      config,
      schema: {
        tags,
        summary: 'Update an agent (the fields present)',
        operationId: method === 'PATCH' ? 'updateAgent' : 'putAgent',
        description:
          'A new `environment_id` retires the sandboxes built for the agent on the old environment. The merged agent is checked as on create (a `sandbox_provider` this instance does not offer is 422).',
        params: IdParam,
        body: AgentPatch,
        response: { 200: Agent, 404: ErrorBody, 422: ErrorBody },
      },
      handler: async (req) =>
        shapeAgent(
          await agents.updateAgent(deps.sql, actorOf(requirePrincipal(req)), req.params.id, req.body, {
            retire: deps.retireSandboxes,
            providers: deps.launch.providers,
          }),
        ),
    });
  }

  r.delete('/api/agents/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete an agent',
      description:
        "Its conversations stay listed and readable; a prompt to one of them answers 404. An agent on the team leaves it first, as `DELETE /api/team/:agent_id` does. 404 for an unknown agent or another account's.",
      operationId: 'deleteAgent',
      params: IdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await agents.deleteAgent(deps, actorOf(requirePrincipal(req)), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.get('/api/agents/:id/avatar', {
    config,
    schema: {
      tags,
      summary: 'The avatar image bytes, served with nosniff and a sandboxing CSP',
      description: 'The stored image with its media type (png, jpeg, gif or webp). 404 when the agent has no avatar.',
      operationId: 'getAgentAvatar',
      params: IdParam,
      response: { 404: ErrorBody },
    },
    handler: async (req, reply) => {
      const avatar = await agents.getAvatar(deps.sql, requirePrincipal(req).accountId, req.params.id);
      return (
        reply
          .type(avatar.media_type)
          .header('x-content-type-options', 'nosniff')
          .header('content-security-policy', "default-src 'none'; sandbox")
          .header('cache-control', 'private, max-age=60')
          // Bytes, not JSON: the response schema describes only errors, so the type is widened here.
          .send(Buffer.from(avatar.bytes) as never)
      );
    },
  });

  // Raw image bodies: any content type reaches the handler as bytes, read up to the body limit
  // and no further; the service refuses more than 5 MB (413) and judges the type by the bytes'
  // signature (415). Reading to the end before answering keeps the answer on a live connection.
  await app.register(async (scope) => {
    scope.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
    scope.withTypeProvider<ZodTypeProvider>().put('/api/agents/:id/avatar', {
      config,
      schema: {
        tags,
        summary: 'Set the avatar: raw bytes with an image content type, or JSON {data: base64, media_type}',
        operationId: 'setAgentAvatar',
        description:
          'png, jpeg, gif or webp, judged by the bytes; at most 5 MB. 415 for another type, 413 when larger.',
        params: IdParam,
        response: { 200: Agent, 404: ErrorBody, 413: ErrorBody, 415: ErrorBody, 422: ErrorBody },
      },
      handler: async (req) => {
        const who = actorOf(requirePrincipal(req));
        const type = req.headers['content-type'] ?? '';
        let bytes: Buffer;
        let mediaType: string;
        if (Buffer.isBuffer(req.body) || typeof req.body === 'string') {
          // text/plain has its own parser and arrives as a string; it is no image either way.
          bytes = Buffer.isBuffer(req.body) ? req.body : Buffer.from(req.body);
          mediaType = type;
        } else {
          const parsed = AvatarJson.safeParse(req.body);
          if (!parsed.success) throw validationFailed({ data: ['send {data: base64, media_type} or raw image bytes'] });
          if (!/^[A-Za-z0-9+/]*={0,2}$/.test(parsed.data.data)) throw validationFailed({ data: ['must be base64'] });
          bytes = Buffer.from(parsed.data.data, 'base64');
          mediaType = parsed.data.media_type;
        }
        if (bytes.length === 0) throw new ApiError('unsupported_media_type', 'The body is empty.');
        return shapeAgent(await agents.putAvatar(deps.sql, who, req.params.id, mediaType, bytes));
      },
    });
  });

  r.delete('/api/agents/:id/avatar', {
    config,
    schema: {
      tags,
      summary: 'Remove the avatar',
      description: 'Idempotent: an agent without an avatar also answers 204.',
      operationId: 'deleteAgentAvatar',
      params: IdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await agents.deleteAvatar(deps.sql, actorOf(requirePrincipal(req)), req.params.id);
      return reply.code(204).send(null);
    },
  });
}
