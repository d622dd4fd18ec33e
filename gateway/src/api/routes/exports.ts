import { createReadStream } from 'node:fs';
import { ErrorBody, Export, IdParam, listOf } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { EXPORT_FILE_LISTS } from '../../services/export-file.ts';
import * as exports from '../../services/exports.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['account'];
/** The resource lists of an export file (every list but the log), for the descriptions. */
const RESOURCE_LISTS = EXPORT_FILE_LISTS.filter((l) => l !== 'events').join(', ');

export function exportRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'full' as const };

  r.post('/api/account/exports', {
    config,
    schema: {
      tags,
      summary: 'Request an export of the whole account',
      description: `Starts building, in the background, one gzipped JSON file of every resource of the account (${RESOURCE_LISTS}) and its whole event log. Secret values are never included: secrets appear by key only, webhook secrets and inference credentials not at all; support reports appear without their screenshots. 202 with the export, \`pending\`; poll it (or the list) until \`downloadable\`. One request per hour and one export at a time: 429 \`rate_limited\` with \`Retry-After\` (seconds). A newer export that becomes ready replaces (and deletes) the older one. Needs a full-scope credential.`,
      operationId: 'requestExport',
      response: { 202: Export, 401: ErrorBody, 403: ErrorBody, 429: ErrorBody },
    },
    handler: async (req, reply) => {
      const created = await exports.requestExport(deps.sql, requirePrincipal(req), new Date());
      return reply.code(202).send(created);
    },
  });

  r.get('/api/account/exports', {
    config,
    schema: {
      tags,
      summary: 'The latest export, as a zero- or one-element list',
      description:
        'The most recently requested export (pending, ready or failed), or an empty list when none was requested. Older exports are replaced once a newer one is ready. Needs a full-scope credential.',
      operationId: 'listExports',
      response: { 200: listOf(Export), 401: ErrorBody, 403: ErrorBody },
    },
    handler: async (req) => ({ data: await exports.listExports(deps.sql, requirePrincipal(req).accountId) }),
  });

  r.get('/api/account/exports/:id', {
    config,
    schema: {
      tags,
      summary: 'One export, with its build progress',
      description:
        "While `pending`, `progress.events_written` counts the log events written so far. 404 for an unknown id, another tenant's, or one replaced by a newer export. Needs a full-scope credential.",
      operationId: 'getExport',
      params: IdParam,
      response: { 200: Export, 401: ErrorBody, 403: ErrorBody, 404: ErrorBody },
    },
    handler: async (req) => exports.getExport(deps.sql, requirePrincipal(req).accountId, req.params.id),
  });

  r.get('/api/account/exports/:id/download', {
    config,
    schema: {
      tags,
      summary: 'Download the export file (gzipped JSON)',
      description: `The file as stored: \`content-type: application/gzip\`, named \`svc-export-<id>.json.gz\`; gunzip it to get one JSON object \`{format: "svc-export", version: 1, account_id, exported_at, ${EXPORT_FILE_LISTS.join(', ')}}\`, each a list of rows; \`events\` is the whole log oldest first, each with \`conversation_id\`; \`support_reports\` leave out screenshots. 404 until the export is downloadable.`,
      operationId: 'downloadExport',
      params: IdParam,
      response: { 401: ErrorBody, 403: ErrorBody, 404: ErrorBody },
    },
    handler: async (req, reply) => {
      const file = await exports.downloadPath(
        deps.sql,
        deps.exportFiles,
        requirePrincipal(req).accountId,
        req.params.id,
      );
      reply
        .type('application/gzip')
        .header('content-disposition', `attachment; filename="svc-export-${req.params.id}.json.gz"`)
        .header('cache-control', 'private, no-store');
      if (file.bytes !== null) reply.header('content-length', String(file.bytes));
      // Bytes, not JSON: the response schema describes only errors, so the type is widened here.
      return reply.send(createReadStream(file.path) as never);
    },
  });
}
