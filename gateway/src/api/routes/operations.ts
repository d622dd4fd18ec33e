import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';
import { ApiError, ErrorBody } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { checkReadiness } from '../../services/readiness.ts';
import type { ApiDeps } from '../deps.ts';

const Readiness = z.object({
  status: z.literal('ready'),
  checks: z.object({
    database: z.enum(['ok', 'unreachable']),
    redis: z.enum(['ok', 'unreachable', 'not_configured']),
    migrations: z.enum(['ok', 'pending', 'unknown']),
  }),
});

// `status` and `checks` come with `not_ready`.
const NotReady = ErrorBody.extend({
  status: z.literal('not_ready').optional(),
  checks: Readiness.shape.checks.optional(),
});

/** True for 127.0.0.0/8 and ::1, also written as IPv4-mapped IPv6. */
function isLoopback(ip: string | null): boolean {
  if (!ip) return false;
  const v4 = ip.replace(/^::ffff:/i, '');
  if (isIP(v4) === 4) return v4.startsWith('127.');
  return ip === '::1';
}

const digest = (s: string) => createHash('sha256').update(s).digest();

/**
 * What operators and orchestrators ask a process: readiness (`/api/ready`, beside the liveness
 * of `/api/health`) and its Prometheus metrics (`/metrics`).
 */
export function operationRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();

  r.get('/api/ready', {
    config: { auth: 'public' },
    schema: {
      tags: ['meta'],
      summary: 'Readiness: the database and Redis answer and every migration is applied',
      description:
        '200 when this process can serve: the database answers, Redis answers (`not_configured` when the instance runs on its embedded in-memory log), and every migration is applied. Otherwise 503 `not_ready` with `Retry-After`, naming each check: `unreachable` (no answer within 2 s), `pending` (migrations not applied yet) or `unknown` (the database could not be asked). Public, like `/api/health`, which only says the process answers.',
      security: [],
      errors: ['not_ready'],
      response: { 200: Readiness, 503: NotReady },
    },
    handler: async () => {
      const { ready, checks } = await checkReadiness(deps.readiness);
      if (ready) return { status: 'ready' as const, checks };
      const failing = Object.entries(checks)
        .filter(([, v]) => v !== 'ok' && v !== 'not_configured')
        .map(([k, v]) => `${k} ${v}`);
      // Answered by the error handler, with Retry-After as every 503.
      throw new ApiError('not_ready', `Not ready: ${failing.join(', ')}.`, { extra: { status: 'not_ready', checks } });
    },
  });

  // Open on loopback; from elsewhere only with METRICS_TOKEN as a bearer (refused when unset).
  // The series show no tenant content, but load and routes are an operator's business.
  const token = deps.config.METRICS_TOKEN;
  const expected = token ? digest(token) : undefined;
  app.get('/metrics', { config: { auth: 'public' }, schema: { hide: true } }, async (request, reply) => {
    if (!isLoopback(request.clientIp)) {
      if (!expected) {
        throw new ApiError('forbidden', '/metrics answers only on loopback unless METRICS_TOKEN is set.');
      }
      const m = /^Bearer\s+(\S+)\s*$/i.exec(request.headers.authorization ?? '');
      if (!m?.[1] || !timingSafeEqual(digest(m[1]), expected)) {
        throw new ApiError('unauthorized', '/metrics needs Authorization: Bearer <METRICS_TOKEN>.');
      }
    }
    const { contentType, body } = await deps.metrics.scrape();
    return reply.type(contentType).send(body);
  });
}
