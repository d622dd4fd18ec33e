import { AuditPage, AuditQuery, ErrorBody } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { listAudit } from '../../services/audit.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

export function auditRoutes(app: FastifyInstance, deps: ApiDeps): void {
  app.withTypeProvider<ZodTypeProvider>().get('/api/audit', {
    config: { auth: 'user' },
    schema: {
      tags: ['audit'],
      summary: "The account's audit trail, newest first; append-only",
      operationId: 'listAuditRows',
      description:
        '`before` takes `meta.next_cursor` to page backwards; `action_prefix` is a literal prefix such as `vault.`; `since` and `until` are ISO 8601 (a malformed one is 400).',
      querystring: AuditQuery,
      response: { 200: AuditPage, 400: ErrorBody, 401: ErrorBody },
    },
    handler: async (req) => listAudit(deps.sql, requirePrincipal(req).accountId, req.query),
  });
}
