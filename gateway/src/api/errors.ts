import { ApiError, tooLarge } from '@svc/core';
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { hasZodFastifySchemaValidationErrors } from 'fastify-type-provider-zod';

/** Fastify's own error codes, mapped onto our catalogue. */
const FASTIFY_CODES: Record<string, ApiError['code']> = {
  FST_ERR_CTP_BODY_TOO_LARGE: 'payload_too_large',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'invalid_request',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_request',
  FST_ERR_CTP_INVALID_JSON_BODY: 'invalid_request',
  FST_ERR_CTP_EMPTY_TYPE: 'invalid_request',
  FST_ERR_CTP_INVALID_TYPE: 'invalid_request',
};

function validationDetails(err: { validation: { instancePath?: string; message?: string; params?: unknown }[] }) {
  const details: Record<string, string[]> = {};
  for (const v of err.validation) {
    const issue = (v.params as { issue?: { path?: PropertyKey[] } } | undefined)?.issue;
    const path = issue?.path?.length
      ? issue.path.map(String).join('.')
      : (v.instancePath ?? '').replace(/^\//, '').replace(/\//g, '.');
    const key = path || '(body)';
    details[key] ??= [];
    details[key].push(v.message ?? 'is not valid');
  }
  return details;
}

/**
 * Turns anything thrown into `{error, message}`: our ApiErrors as they are, Fastify's parse
 * errors into the catalogue, request validation into 400 (query, params, a body that is not an
 * object) or 422 `validation_failed` with `details` (fields of a body), and everything else into
 * a 500 that shows no internals.
 */
export function toApiError(err: unknown, request: FastifyRequest): ApiError {
  if (err instanceof ApiError) return err;
  if (hasZodFastifySchemaValidationErrors(err)) {
    const context = (err as { validationContext?: string }).validationContext;
    const details = validationDetails(err);
    if (
      context === 'body' &&
      typeof request.body === 'object' &&
      request.body !== null &&
      !Array.isArray(request.body)
    ) {
      return new ApiError('validation_failed', undefined, { extra: { details } });
    }
    const where = context === 'querystring' ? 'query' : (context ?? 'request');
    const first = Object.entries(details)[0];
    const message = first ? `${where} ${first[0]}: ${first[1].join('; ')}` : `invalid ${where}`;
    return new ApiError('invalid_request', message, { extra: { details } });
  }
  const fe = err as Partial<FastifyError>;
  if (fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE' || fe.statusCode === 413) {
    return tooLarge('The request body', request.routeOptions.bodyLimit);
  }
  // DECISIONS: a wrong content type on a JSON route is 400 invalid_request (routes that take
  // raw bytes answer 415 themselves).
  if (fe.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
    const type = request.headers['content-type'] ?? 'none';
    return new ApiError(
      'invalid_request',
      `This route reads a JSON body, not ${type}: send it with Content-Type: application/json.`,
    );
  }
  const mapped = fe.code ? FASTIFY_CODES[fe.code] : undefined;
  if (mapped) return new ApiError(mapped, fe.message);
  // Another plugin's client error (a static file that is not there, a path it refuses): its
  // status, in our catalogue's terms. A path outside what is served is one that is not there.
  const status = fe.statusCode ?? 500;
  if (status === 403 || status === 404)
    return new ApiError('not_found', `No route ${request.method} ${request.url.split('?')[0]}.`);
  if (status === 405) return new ApiError('method_not_allowed');
  if (status === 415) return new ApiError('unsupported_media_type', fe.message);
  if (status >= 400 && status < 500) return new ApiError('invalid_request', fe.message);
  return new ApiError('internal_error');
}

/** Whether `err` says the client hung up (its body was cut off), not that something failed. */
export function clientLeft(err: unknown): boolean {
  const e = err as { code?: string; message?: string } | null;
  return e?.code === 'ECONNRESET' || e?.code === 'ECONNABORTED' || e?.message === 'aborted';
}

export function sendApiError(reply: FastifyReply, e: ApiError): FastifyReply {
  if (e.retryAfter !== undefined) reply.header('retry-after', String(e.retryAfter));
  return reply.code(e.status).type('application/json; charset=utf-8').send(e.body());
}
