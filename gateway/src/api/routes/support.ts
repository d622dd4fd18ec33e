import { ErrorBody, IdParam, listOf, SupportReport, SupportReportCreate } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { actorOf } from '../../services/principal.ts';
import * as support from '../../services/support.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['support'];

export function supportRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };

  r.post('/api/support/reports', {
    config,
    schema: {
      tags,
      summary: 'Send a support report',
      description:
        "201 with the report, status `new`. A background job then forwards it: an issue on the instance's code host (labels `support` and the category) when a repository and token are configured, and a mail with the screenshot attached to the instance's support address when one is set; either, both, or neither (the stored reports are then the inbox). The report ends `forwarded`, or `failed` with `forward_error` once its retries are spent. `message` at most 20 KB, `context` at most 64 KB as JSON, `screenshot` at most 5 MB: 413 `payload_too_large` naming the field. A screenshot whose bytes are not the png, jpeg, gif or webp it claims to be: 415 `unsupported_media_type`. Audited as `support.report.created` with the category, the sizes and the context's keys, never the message.",
      operationId: 'createSupportReport',
      body: SupportReportCreate,
      response: { 201: SupportReport, 413: ErrorBody, 415: ErrorBody, 422: ErrorBody },
    },
    handler: async (req, reply) =>
      reply
        .code(201)
        .send(
          await support.createReport(
            { sql: deps.sql, keyring: deps.keyring },
            actorOf(requirePrincipal(req)),
            req.body,
          ),
        ),
  });

  r.get('/api/support/reports', {
    config,
    schema: {
      tags,
      summary: "The caller's support reports, newest first",
      description:
        'Every report the account sent, with its forwarding status; a report shows that a screenshot exists (type and size), never the image.',
      operationId: 'listSupportReports',
      response: { 200: listOf(SupportReport) },
    },
    handler: async (req) => ({ data: await support.listReports(deps.sql, requirePrincipal(req).accountId) }),
  });

  r.get('/api/support/reports/:id', {
    config,
    schema: {
      tags,
      summary: 'One support report',
      description: "404 for an unknown id or another account's.",
      operationId: 'getSupportReport',
      params: IdParam,
      response: { 200: SupportReport, 404: ErrorBody },
    },
    handler: async (req) => support.getReport(deps.sql, requirePrincipal(req).accountId, req.params.id),
  });
}
