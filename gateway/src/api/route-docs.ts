import { ErrorBody, type ErrorCode, errorCatalogue, statusOf } from '@svc/core';
import type { RouteOptions } from 'fastify';

declare module 'fastify' {
  interface FastifySchema {
    /**
     * The catalogue codes this route answers besides the ones every route of its kind can give
     * (see `errorCodesOf`). Each is documented under its status with an example body.
     */
    errors?: readonly ErrorCode[];
  }
}

/** What the error answers of one operation may carry: status to catalogue codes. */
export type ErrorCodes = Map<number, ErrorCode[]>;

type DescribedSchema = {
  response?: Record<string | number, unknown>;
  hide?: boolean;
  body?: unknown;
  querystring?: unknown;
  params?: unknown;
  errors?: readonly ErrorCode[];
  operationId?: string;
  security?: unknown[];
};

/**
 * Describes one route as it is registered, so no route can be left out: sets its
 * `operationId` (derived from method and path unless the route names one), states that a
 * public route needs no credential (`security: []`), and adds the shared
 * Error schema under every error status the route can answer. Returns the codes per status
 * (undefined for a route hidden from the document), for `errorResponse` to list.
 */
export function describeRoute(route: RouteOptions): ErrorCodes | undefined {
  const schema = route.schema as DescribedSchema | undefined;
  if (!schema || schema.hide) return undefined;
  const method = Array.isArray(route.method) ? route.method[0] : route.method;
  schema.operationId ??= operationIdOf(String(method), route.url);
  // A public route needs no credential: said per operation, or generated clients and the docs'
  // locks follow the document-wide default (a key or a session).
  if ((route.config as { auth?: string } | undefined)?.auth === 'public') schema.security ??= [];
  const codes = errorCodesOf(route);
  schema.response ??= {};
  for (const status of codes.keys()) schema.response[status] ??= ErrorBody;
  return codes;
}

/** The code an error status stands for when a route declares the status and names no code of it. */
const GENERIC: Record<number, ErrorCode> = {
  400: 'invalid_request',
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  422: 'validation_failed',
  429: 'rate_limited',
  500: 'internal_error',
};

/**
 * The codes a route can answer. Every route: 429 `rate_limited` (the edge's limit), 500
 * `internal_error`. With
 * credentials: 401 `unauthorized`, 403 `forbidden` and `account_suspended`. With input: 400
 * `invalid_request`; with a body: 413 `payload_too_large`, 422 `validation_failed`. Then the
 * route's own `errors`; a status the route declares without naming a code of it answers the
 * status's generic code (404 `not_found`, ...).
 */
export function errorCodesOf(route: RouteOptions): ErrorCodes {
  const schema = (route.schema ?? {}) as DescribedSchema;
  const codes: ErrorCodes = new Map();
  const add = (code: ErrorCode) => {
    const status = statusOf(code);
    const list = codes.get(status) ?? [];
    if (!list.includes(code)) list.push(code);
    codes.set(status, list);
  };
  const auth = (route.config as { auth?: string } | undefined)?.auth;
  if (auth && auth !== 'public') {
    add('unauthorized');
    add('forbidden');
    add('account_suspended');
  }
  if (schema.body || schema.querystring || schema.params) add('invalid_request');
  if (schema.body) {
    add('payload_too_large');
    add('validation_failed');
  }
  for (const code of schema.errors ?? []) add(code);
  for (const status of Object.keys(schema.response ?? {}).map(Number)) {
    const generic = GENERIC[status];
    if (status >= 400 && !codes.has(status) && generic) add(generic);
  }
  add('rate_limited');
  add('internal_error');
  return codes;
}

/**
 * The OpenAPI response object of an error status: the shared Error schema (or the route's own
 * extension of it), a description listing each code it can carry with its meaning, and one
 * example body per code.
 */
export function errorResponse(
  codes: readonly ErrorCode[],
  schema: unknown = { $ref: '#/components/schemas/Error' },
): object {
  return {
    description: codes.map((code) => `\`${code}\`: ${errorCatalogue[code][1]}`).join('\n\n'),
    content: {
      'application/json': {
        schema,
        examples: Object.fromEntries(
          codes.map((code) => [code, { value: { error: code, message: errorCatalogue[code][1] } }]),
        ),
      },
    },
  };
}

const VERBS: Record<string, string> = { GET: 'get', POST: 'create', PUT: 'replace', PATCH: 'update', DELETE: 'delete' };

/**
 * A stable camelCase name from method and path, for routes that do not name themselves:
 * `GET /api/agents` is `listAgents`, `GET /api/agents/:id` `getAgent`, `POST /api/agents`
 * `createAgent`, `PUT` `replaceAgent`, `PATCH` `updateAgent`, `DELETE` `deleteAgent`; a
 * path's earlier resources name the owner (`listConversationTurns`). A POST to a path that
 * ends in a verb (`/interrupt`) uses that verb (`interruptConversation`).
 */
export function operationIdOf(method: string, url: string): string {
  const segments = url.split('/').filter((s) => s && s !== 'api');
  const last = segments.at(-1) ?? '';
  const onItem = last.startsWith(':');
  const words = segments.filter((s) => !s.startsWith(':')).map(pascal);
  const action = method === 'POST' && !onItem && !last.endsWith('s') && words.length > 1;
  const nouns = (action ? words.slice(0, -1) : words).map((w, i, all) =>
    i < all.length - 1 || onItem || method !== 'GET' ? singular(w) : w,
  );
  let verb = action ? lowerFirst(words.at(-1) ?? '') : (VERBS[method] ?? method.toLowerCase());
  if (method === 'GET' && !onItem && last.endsWith('s')) verb = 'list';
  return verb + nouns.join('');
}

function pascal(segment: string): string {
  return segment
    .replace(/^\./, '')
    .split(/[-_.]/)
    .filter(Boolean)
    .map((w) => w[0]!.toUpperCase() + w.slice(1))
    .join('');
}

function singular(word: string): string {
  if (word.endsWith('ies')) return `${word.slice(0, -3)}y`;
  if (word.endsWith('xes')) return word.slice(0, -2);
  if (word.endsWith('s') && !word.endsWith('ss') && !word.endsWith('us')) return word.slice(0, -1);
  return word;
}

function lowerFirst(word: string): string {
  return word ? word[0]!.toLowerCase() + word.slice(1) : word;
}
