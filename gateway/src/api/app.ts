import type { Duplex } from 'node:stream';
import fastifyCookie from '@fastify/cookie';
import fastifyCors from '@fastify/cors';
import fastifyFormbody from '@fastify/formbody';
import fastifySwagger from '@fastify/swagger';
import { ApiError } from '@svc/core';
import Fastify, { type FastifyBaseLogger, type FastifyReply, type FastifyRequest, LogController } from 'fastify';
import { jsonSchemaTransform, jsonSchemaTransformObject, serializerCompiler } from 'fastify-type-provider-zod';
import { clientAddress, exemptMatcher } from '../addresses.ts';
import { CLIENT_IP_HEADER } from '../internal-headers.ts';
import type { AdmitFor } from '../ratelimit/admission.ts';
import { REQUEST_ID_HEADER, requestId } from '../request-id.ts';
import type { StreamServer } from '../streams/streams.ts';
import { registerAuth } from './auth.ts';
import type { ApiDeps } from './deps.ts';
import { clientLeft, sendApiError, toApiError } from './errors.ts';
import { describeRoute } from './route-docs.ts';
import { RouteTable } from './route-table.ts';
import { accountRoutes } from './routes/account.ts';
import { adminRoutes } from './routes/admin.ts';
import { agentRoutes } from './routes/agents.ts';
import { applyRoutes } from './routes/apply.ts';
import { auditRoutes } from './routes/audit.ts';
import { authRoutes } from './routes/auth.ts';
import { billingRoutes } from './routes/billing.ts';
import { billingAdminRoutes } from './routes/billing-admin.ts';
import { catalogRoutes } from './routes/catalog.ts';
import { conversationRoutes } from './routes/conversations.ts';
import { environmentRoutes } from './routes/environments.ts';
import { exportRoutes } from './routes/exports.ts';
import { metaRoutes } from './routes/meta.ts';
import { oauthRoutes } from './routes/oauth.ts';
import { operationRoutes } from './routes/operations.ts';
import { linkPages } from './routes/pages.ts';
import { permissionRoutes } from './routes/permissions.ts';
import { runnerSocketRoute } from './routes/runner-socket.ts';
import { runnerRoutes } from './routes/runners.ts';
import { sandboxRoutes } from './routes/sandboxes.ts';
import { scheduleRoutes } from './routes/schedules.ts';
import { searchRoutes } from './routes/search.ts';
import { secretBindingRoutes } from './routes/secret-bindings.ts';
import { streamRoutes } from './routes/streams.ts';
import { supportRoutes } from './routes/support.ts';
import { teamRoutes } from './routes/team.ts';
import { teamMcpRoutes } from './routes/team-mcp.ts';
import { vaultRoutes } from './routes/vaults.ts';
import { webhookRoutes } from './routes/webhooks.ts';
import { validatorCompiler } from './validation.ts';

export interface ApiOptions {
  /** True when requests arrive through our edge, which sets `x-svc-client-ip`. */
  behindEdge: boolean;
  /**
   * Serving alone (not behind the edge), the api role takes on the edge's other duties: the
   * rate limit of every `/api` path, and the streams.
   */
  alone?: { admitFor: AdmitFor; streams: StreamServer };
}

/** What Node's HTTP parser could not take: 400 (431 for a head too large) in `{error, message}`. */
function answerClientError(err: NodeJS.ErrnoException & { reason?: string }, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const tooLarge = err.code === 'HPE_HEADER_OVERFLOW';
  const timedOut = err.code === 'ERR_HTTP_REQUEST_TIMEOUT';
  const status = tooLarge
    ? '431 Request Header Fields Too Large'
    : timedOut
      ? '408 Request Timeout'
      : '400 Bad Request';
  const message = tooLarge
    ? 'The request head is larger than this server takes.'
    : timedOut
      ? 'The request did not arrive in time.'
      : `The request is not HTTP/1.1 this server can read${err.reason ? `: ${err.reason}` : ''}.`;
  const body = JSON.stringify({ error: 'invalid_request', message });
  socket.end(
    `HTTP/1.1 ${status}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}

/** Builds the api role: every non-streaming route, validated and described by zod schemas. */
export async function buildApi(deps: ApiDeps, options: ApiOptions) {
  const app = Fastify({
    loggerInstance: deps.log.child({ role: 'api' }) as FastifyBaseLogger,
    // Fastify's own pair of lines per request would log the raw URL (a query may hold a token);
    // the onResponse hook below logs one line with the route pattern instead.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: deps.config.BODY_LIMIT_BYTES,
    trustProxy: false,
    // The client's X-Request-Id when usable (behind the edge, the edge settled it), else a new one.
    genReqId: (req) => requestId(req.headers[REQUEST_ID_HEADER]),
    routerOptions: { ignoreTrailingSlash: true, maxParamLength: 200 },
    // Listening alone (EDGE=false), a request Node's parser refuses (a header line without a
    // colon, a bare LF, no Host, two lengths...) is answered in our shape, then closed.
    clientErrorHandler: answerClientError,
    // Node would answer a missing Host with a bare 400; the hook below says why.
    http: { requireHostHeader: false },
  });
  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);

  const routeTable = new RouteTable();
  app.addHook('onRoute', (route) => {
    routeTable.add(route, describeRoute(route));
  });

  // An empty body with a JSON content type is "no body", so a bare POST works from any client.
  // The bytes must be UTF-8 (RFC 8259): decoded strictly, not with replacement characters that
  // would then be stored.
  const jsonParser = app.getDefaultJsonParser('error', 'error');
  // No route reads plain text: a text body is refused naming its type (toApiError), not read
  // as a string that then fails the body's schema.
  app.removeContentTypeParser('text/plain');
  const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: false });
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, bytes, done) => {
    let body: string;
    try {
      body = utf8.decode(bytes as Buffer);
    } catch {
      return done(new ApiError('invalid_request', 'The body is not valid UTF-8; JSON text must be.'), undefined);
    }
    if (body.trim() === '') return done(null, undefined);
    return jsonParser(req, body, done);
  });

  await app.register(fastifyCookie);
  await app.register(fastifyFormbody);
  // A form body (what `curl -d` sends) reaches only the routes that take one: elsewhere it is
  // refused saying so, rather than read as one odd field of a JSON object.
  app.addHook('preValidation', async (request) => {
    const type = request.headers['content-type'];
    if (!type?.toLowerCase().startsWith('application/x-www-form-urlencoded')) return;
    if (request.routeOptions.schema?.consumes?.includes('application/x-www-form-urlencoded')) return;
    throw new ApiError(
      'invalid_request',
      'The body was sent as a form (Content-Type: application/x-www-form-urlencoded, what `curl -d` sends), so it was not read as JSON: send it with Content-Type: application/json.',
    );
  });
  await app.register(fastifyCors, {
    // Only bearer keys cross an origin: no credentials mode, so cookies are never sent cross-origin.
    origin: deps.config.API_CORS_ORIGINS.length ? deps.config.API_CORS_ORIGINS : false,
    credentials: false,
    methods: ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'],
    allowedHeaders: ['authorization', 'content-type', 'last-event-id', 'x-svc-parent-conversation-id'],
    exposedHeaders: ['retry-after'],
    maxAge: 600,
  });
  await app.register(fastifySwagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Agent sandbox service API',
        version: '0.1.0',
        description:
          'Runs AI coding agents on sandboxes. Every error answers `{error, message}`; branch on `error`. Authenticate with `Authorization: Bearer <API key>`.',
      },
      components: {
        securitySchemes: {
          bearer: { type: 'http', scheme: 'bearer', description: 'An API key, OAuth-issued key or sandbox token.' },
          session: { type: 'apiKey', in: 'cookie', name: 'svc_session', description: 'Console session.' },
        },
      },
      security: [{ bearer: [] }, { session: [] }],
    },
    transform: jsonSchemaTransform,
    transformObject: jsonSchemaTransformObject,
  });

  // Counted by route pattern (never the raw URL) once the answer is sent; cheap per request.
  app.addHook('onResponse', async (request, reply) => {
    deps.metrics.requestDone(request.method, request.routeOptions.url, reply.statusCode, reply.elapsedTime / 1000);
  });

  // On the raw response, so errors, 404s and hijacked streams carry it too.
  const replies = new WeakMap<FastifyRequest, FastifyReply>();
  app.addHook('onRequest', async (request, reply) => {
    reply.raw.setHeader(REQUEST_ID_HEADER, request.id);
    replies.set(request, reply);
  });
  // RFC 9112 3.2: an HTTP/1.1 request without Host is refused (after the id is set, so the
  // refusal carries it).
  app.addHook('onRequest', async (request) => {
    if (request.raw.httpVersion === '1.1' && request.headers.host === undefined) {
      throw new ApiError('invalid_request', 'The request is not HTTP/1.1 this server can read: it has no Host header.');
    }
  });
  // One line per request: when the response has gone, or when the client left before (a
  // stream the watcher closed, a request cut off), then marked `aborted`.
  const requestLine = (request: FastifyRequest, aborted: boolean) => {
    const reply = replies.get(request);
    request.log.info(
      {
        method: request.method,
        route: request.routeOptions.url ?? null,
        status: reply?.statusCode ?? 0,
        ms: Math.round((reply?.elapsedTime ?? 0) * 10) / 10,
        ...(aborted ? { aborted } : {}),
      },
      'request',
    );
  };
  app.addHook('onResponse', async (request) => requestLine(request, false));
  app.addHook('onRequestAbort', async (request) => requestLine(request, true));

  // Behind the edge, the address the edge read; alone, read here the same way (TRUST_PROXY).
  const trusted = deps.config.TRUST_PROXY.length ? exemptMatcher(deps.config.TRUST_PROXY) : undefined;
  const clientIpOf = options.behindEdge
    ? (r: FastifyRequest) => (r.headers[CLIENT_IP_HEADER] as string | undefined) ?? null
    : (r: FastifyRequest) => {
        const forwarded = r.headers['x-forwarded-for'];
        return clientAddress(
          r.socket.remoteAddress ?? '',
          Array.isArray(forwarded) ? forwarded.join(',') : forwarded,
          trusted,
        );
      };

  const alone = options.behindEdge ? undefined : options.alone;
  if (alone) {
    // Before authentication, as at the edge: a refused request costs no credential lookup.
    app.addHook('onRequest', async (request) => {
      const refused = await alone.admitFor(clientIpOf(request) ?? '', request.url)();
      if (refused) throw refused;
    });
  }

  registerAuth(app, {
    sql: deps.sql,
    credentialCache: deps.credentialCache,
    ownOrigin: () => new URL(deps.publicUrl()).origin,
    clientIpOf,
  });

  app.setErrorHandler((err, request, reply) => {
    // The client hung up while its body was read: nothing went wrong here, and nobody listens.
    if (clientLeft(err)) {
      request.log.info({ code: (err as { code?: string }).code }, 'the client left before its request was read');
      return sendApiError(reply, new ApiError('invalid_request', 'The request was cut off.'));
    }
    const e = toApiError(err, request);
    if (e.status >= 500) request.log.error({ err }, 'request failed');
    return sendApiError(reply, e);
  });
  app.setNotFoundHandler((request, reply) => {
    const allowed = routeTable.methodsFor(request.url.split('?')[0] ?? '/');
    if (allowed.length && !allowed.includes(request.method)) {
      reply.header('allow', allowed.join(', '));
      return sendApiError(reply, new ApiError('method_not_allowed'));
    }
    return sendApiError(reply, new ApiError('not_found', `No route ${request.method} ${request.url.split('?')[0]}.`));
  });

  authRoutes(app, deps);
  accountRoutes(app, deps);
  await billingRoutes(app, deps);
  billingAdminRoutes(app, deps);
  exportRoutes(app, deps);
  auditRoutes(app, deps);
  oauthRoutes(app, deps);
  linkPages(app, deps);
  environmentRoutes(app, deps);
  vaultRoutes(app, deps);
  runnerRoutes(app, deps);
  // Behind the edge, runners connect to the edge; alone, the api role takes them itself.
  if (!options.behindEdge) await runnerSocketRoute(app, deps);
  if (alone) streamRoutes(app, alone.streams);
  await agentRoutes(app, deps);
  catalogRoutes(app, deps);
  applyRoutes(app, deps);
  conversationRoutes(app, deps);
  sandboxRoutes(app, deps);
  scheduleRoutes(app, deps);
  teamRoutes(app, deps);
  supportRoutes(app, deps);
  searchRoutes(app, deps);
  permissionRoutes(app, deps);
  teamMcpRoutes(app, deps);
  webhookRoutes(app, deps);
  secretBindingRoutes(app, deps);
  adminRoutes(app, deps);
  await metaRoutes(app, deps, routeTable);
  operationRoutes(app, deps);

  await app.ready();
  // Not `return app`: a Fastify instance is thenable, and an async function would await it.
  return { app, routeTable };
}
