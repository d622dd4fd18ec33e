import fastifySwaggerUi from '@fastify/swagger-ui';
import { AVATAR_TYPES, ConversationStreamQuery, MultiplexedStreamQuery } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import type { ApiDeps } from '../deps.ts';
import { llmsFullTxt, llmsTxt, type OpenApiDoc, skillMd } from '../discovery.ts';
import { finishDocument } from '../openapi-document.ts';
import { errorResponse } from '../route-docs.ts';
import type { RouteTable } from '../route-table.ts';

/**
 * The machine-readable description and what is generated from it. Public: no auth.
 * Routes the api role does not serve itself (the docs viewer page) are added to the
 * document here, so it describes everything under `/api/`.
 */
export async function metaRoutes(app: FastifyInstance, deps: ApiDeps, routes: RouteTable): Promise<void> {
  const r = app.withTypeProvider<ZodTypeProvider>();
  let cached: OpenApiDoc | undefined;
  const doc = (): OpenApiDoc => {
    if (cached) return cached;
    const d = structuredClone(app.swagger()) as unknown as OpenApiDoc;
    d.paths['/api/docs'] = {
      get: {
        operationId: 'getApiDocs',
        summary: 'Interactive viewer over this description (assets served locally)',
        description:
          'Public. Swagger UI over /api/openapi.json; its scripts and styles are served by this instance, so it works offline.',
        tags: ['meta'],
        security: [],
        responses: { '200': { description: 'HTML page' } },
      },
    };
    describeBinaryBodies(d);
    describeEdgeRoutes(d);
    finishDocument(d, routes, deps.publicUrl());
    cached = d;
    return d;
  };

  r.get('/api/openapi.json', {
    config: { auth: 'public' },
    schema: {
      tags: ['meta'],
      summary: 'This OpenAPI 3.1 description, generated from the code',
      description:
        'Public. The document this reference is built from: every route with its operationId, bodies, error codes and examples. Feed it to a client generator (openapi-typescript, @hey-api/openapi-ts).',
      operationId: 'getOpenApiDocument',
      security: [],
      response: { 200: z.object({ openapi: z.string() }).catchall(z.unknown()) },
    },
    handler: async () => doc() as unknown as { openapi: string },
  });

  r.get('/api/health', {
    config: { auth: 'public' },
    schema: {
      tags: ['meta'],
      summary: 'Liveness: answers while the api role can serve requests',
      description: 'Public and cheap: 200 `{status: "ok"}` while the process serves requests; it checks no dependency.',
      operationId: 'getHealth',
      security: [],
      response: { 200: z.object({ status: z.literal('ok') }) },
    },
    handler: async () => ({ status: 'ok' as const }),
  });

  const text =
    (body: (d: OpenApiDoc, base: string) => string, type: string) =>
    async (_req: unknown, reply: { type(t: string): { send(b: string): unknown } }) =>
      reply.type(type).send(body(doc(), deps.publicUrl()));
  app.get(
    '/llms.txt',
    { config: { auth: 'public' }, schema: { hide: true } },
    text(llmsTxt, 'text/plain; charset=utf-8'),
  );
  app.get(
    '/llms-full.txt',
    { config: { auth: 'public' }, schema: { hide: true } },
    text(llmsFullTxt, 'text/plain; charset=utf-8'),
  );
  app.get(
    '/skill',
    { config: { auth: 'public' }, schema: { hide: true } },
    text(skillMd, 'text/markdown; charset=utf-8'),
  );

  await app.register(fastifySwaggerUi, {
    routePrefix: '/api/docs',
    staticCSP: true,
    // Its policy's upgrade-insecure-requests made a browser fetch the page's scripts over HTTPS
    // from an instance served over plain HTTP on any address but loopback: a blank page.
    // And Swagger UI sets inline styles on the elements it draws (a style, never a script).
    transformStaticCSP: (header: string) =>
      header
        .replace(/\s*upgrade-insecure-requests;?/g, '')
        .replace("style-src 'self'", "style-src 'self' 'unsafe-inline'"),
    uiConfig: { deepLinking: true },
    transformSpecification: () => doc() as unknown as Record<string, unknown>,
  });
}

/**
 * Bodies that are not JSON cannot come from zod schemas; they are described here: the
 * avatar's image bytes, both ways, and the export file.
 */
function describeBinaryBodies(d: OpenApiDoc): void {
  const images = Object.fromEntries(AVATAR_TYPES.map((t) => [t, { schema: { type: 'string', contentMediaType: t } }]));
  const avatar = d.paths['/api/agents/{id}/avatar'];
  if (avatar?.get?.responses) {
    avatar.get.responses['200'] = {
      description: 'The image bytes with the stored media type',
      content: images,
    } as never;
  }
  const download = d.paths['/api/account/exports/{id}/download'];
  if (download?.get?.responses) {
    download.get.responses['200'] = {
      description: 'The gzipped JSON export file',
      content: { 'application/gzip': { schema: { type: 'string', contentMediaType: 'application/gzip' } } },
    } as never;
  }
  if (avatar?.put) {
    avatar.put.requestBody = {
      required: true,
      content: {
        ...images,
        'application/json': {
          schema: {
            type: 'object',
            required: ['data', 'media_type'],
            properties: {
              data: { type: 'string', contentEncoding: 'base64' },
              media_type: { type: 'string', enum: [...AVATAR_TYPES] },
            },
          },
        },
      },
    } as never;
  }
}

/**
 * A query schema as OpenAPI query parameters: the schema the route reads its query with is
 * the one described.
 */
function queryParameters(schema: z.ZodObject): object[] {
  const json = z.toJSONSchema(schema, { io: 'input' }) as {
    properties: Record<string, { description?: string }>;
    required?: string[];
  };
  return Object.entries(json.properties).map(([name, { description, ...rest }]) => ({
    name,
    in: 'query',
    schema: rest,
    ...(description ? { description } : {}),
    ...(json.required?.includes(name) ? { required: true } : {}),
  }));
}

/**
 * The streams and the runner WebSocket are served outside Fastify's schema-described routes
 * (by the edge, or by hidden routes when the api role serves alone), so they are described
 * here, beside the rest.
 */
function describeEdgeRoutes(d: OpenApiDoc): void {
  d.paths['/api/conversations/{id}/stream'] = {
    get: {
      operationId: 'streamConversation',
      tags: ['conversations'],
      summary: "The conversation's log as Server-Sent Events",
      description:
        'Starts with a `: connected` comment, replays events after `Last-Event-ID` (header, or `last_event_id` in the query), then follows live; each event is `id: <event id>` and `data: <log event JSON>`. `wait=false` (default) ends the response once the conversation has no running turn (after the history, or at the end of the running turn); `wait=true` stays open across turns until the conversation terminates. A `: heartbeat` comment every 15 s (SSE_HEARTBEAT_MS); the stream closes after 60 s without events (SSE_IDLE_CLOSE_MS) and the client reconnects with Last-Event-ID. A client that falls more than SSE_MAX_BUFFER_BYTES behind is disconnected and resumes the same way. A Last-Event-ID that is not an event id is 400 `invalid_request`. An account holds at most SSE_MAX_STREAMS_PER_ACCOUNT (1000) open streams on a node: one more is 429 `rate_limited` with Retry-After and `limit`.',
      parameters: [
        { name: 'id', in: 'path', required: true, schema: { type: 'string' } },
        ...queryParameters(ConversationStreamQuery),
        { name: 'Last-Event-ID', in: 'header', schema: { type: 'string' } },
      ],
      responses: {
        '200': { description: 'An event stream', content: { 'text/event-stream': { schema: { type: 'string' } } } },
        '400': errorResponse(['invalid_request']),
        '401': errorResponse(['unauthorized']),
        '403': errorResponse(['forbidden', 'account_suspended']),
        '404': errorResponse(['not_found']),
        '429': errorResponse(['rate_limited']),
        '500': errorResponse(['internal_error']),
      },
    },
  } as never;
  const multiplexed = (operationId: string, summary: string, description: string) =>
    ({
      get: {
        operationId,
        tags: ['conversations'],
        summary,
        description: `${description} Starts with a \`: connected\` comment, then a bare \`id: <position>\` line (it sets the client's last event id without firing an event), so a client that drops before its first event resumes from the moment it connected. Without Last-Event-ID (header, or \`last_event_id\` in the query) it starts live: list first, then watch; with it, it replays every event after that id, once, in order, then follows live. A \`: heartbeat\` comment every 15 s carries \`id: <position>\` when filters skipped events, so a reconnect resumes from there. Closes after 60 s without events; a client that falls too far behind is disconnected; both resume with Last-Event-ID. A Last-Event-ID that is not an event id is 400 \`invalid_request\`. Sandbox tokens may not open it (403). An account holds at most SSE_MAX_STREAMS_PER_ACCOUNT (1000) open streams on a node, of all kinds: one more is 429 \`rate_limited\` with Retry-After and \`limit\`.`,
        parameters: [
          ...queryParameters(MultiplexedStreamQuery),
          { name: 'Last-Event-ID', in: 'header', schema: { type: 'string' } },
        ],
        responses: {
          '200': { description: 'An event stream', content: { 'text/event-stream': { schema: { type: 'string' } } } },
          '400': errorResponse(['invalid_request']),
          '401': errorResponse(['unauthorized']),
          '403': errorResponse(['forbidden', 'account_suspended']),
          '429': errorResponse(['rate_limited']),
          '500': errorResponse(['internal_error']),
        },
      },
    }) as never;
  d.paths['/api/runners/connect'] = {
    get: {
      operationId: 'connectRunner',
      tags: ['runners'],
      summary: 'The runner fabric: a WebSocket for svc-runner',
      description:
        'Upgrade with `Authorization: Bearer <runner token>`. Binary frames, each one msgpack message of the runner protocol (schemas in core/src/runner-protocol.ts): the runner sends `hello` first (protocol version, runner-agent version, instance, hostname, root, capabilities, sandboxes held), the service answers `welcome` (runner id, connection epoch, heartbeat interval), then `heartbeat` at that interval. One live connection per runner: a newer one closes the older with 4001. Close codes: 4001 replaced, 4002 runner deleted, 4003 not a protocol message, 4004 unsupported protocol version, 4005 no hello in time, 1001 going away (reconnect).',
      responses: {
        '101': { description: 'Switching to the WebSocket protocol' },
        '401': errorResponse(['unauthorized']),
        '429': errorResponse(['rate_limited']),
      },
    },
  } as never;
  d.paths['/api/events/stream'] = multiplexed(
    'streamEvents',
    'Every conversation of the caller as one Server-Sent Events stream',
    'Each event is a conversation log event plus `conversation_id`; new conversations are followed on their own (and deleted ones vanish from replays). `event: conversations` with `{"reason":"changed"}` on create, title, read, delete or finish, at most once a second (a burst folds into one, whose id is the position reached).',
  );
  d.paths['/api/team/stream'] = multiplexed(
    'streamTeam',
    "The team channel's conversations as one Server-Sent Events stream",
    'Each event is a log event of a conversation on the team channel (`svc:team`) plus `conversation_id` and `agent_id`. `event: team` with `{"reason":"changed"}` when a teammate is added or removed, a fresh conversation opens for one, or a self-hosted runner connects or drops; `event: schedule` when a schedule is created, updated, deleted or fired.',
  );
}
