import { ApiError } from '@svc/core';
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { hasZodFastifySchemaValidationErrors } from 'fastify-type-provider-zod';

/** Fastify's own error codes, mapped onto our catalogue. */
const FASTIFY_CODES: Record<string, ApiError['code']> = {
  FST_ERR_CTP_BODY_TOO_LARGE: 'payload_too_large',
  // DECISIONS: a wrong content type on a JSON route is 400 invalid_request (routes that take
  // raw bytes answer 415 themselves).
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'invalid_request',
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
  const mapped = fe.code ? FASTIFY_CODES[fe.code] : undefined;
  if (mapped) return new ApiError(mapped, fe.message);
  if (fe.statusCode === 400 && fe.code === 'FST_ERR_VALIDATION') return new ApiError('invalid_request', fe.message);
  if (fe.statusCode === 415) return new ApiError('unsupported_media_type', fe.message);
  if (fe.statusCode === 413) return new ApiError('payload_too_large');
  return new ApiError('internal_error');
}

export function sendApiError(reply: FastifyReply, e: ApiError): FastifyReply {
  if (e.retryAfter !== undefined) reply.header('retry-after', String(e.retryAfter));
  return reply.code(e.status).type('application/json; charset=utf-8').send(e.body());
}
