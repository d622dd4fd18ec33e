import { ErrorBody, IdParam, listOf, Vault, VaultFields } from '@svc/core';
import { vaults as rows } from '@svc/db';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { actorOf } from '../../services/principal.ts';
import * as vaults from '../../services/vaults.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';
import { secretRoutes } from './secrets.ts';

const tags = ['vaults'];

export function vaultRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };

  r.get('/api/vaults', {
    config,
    schema: { tags, summary: 'List vaults', response: { 200: listOf(Vault) } },
    handler: async (req) => ({
      data: (await rows.listVaults(deps.sql, requirePrincipal(req).accountId)).map(vaults.shapeVault),
    }),
  });

  r.post('/api/vaults', {
    config,
    schema: { tags, summary: 'Create a vault', body: VaultFields, response: { 201: Vault, 422: ErrorBody } },
    handler: async (req, reply) =>
      reply
        .code(201)
        .send(vaults.shapeVault(await vaults.createVault(deps.sql, actorOf(requirePrincipal(req)), req.body.name))),
  });

  r.get('/api/vaults/:id', {
    config,
    schema: { tags, summary: 'One vault', params: IdParam, response: { 200: Vault, 404: ErrorBody } },
    handler: async (req) =>
      vaults.shapeVault(await vaults.getVault(deps.sql, requirePrincipal(req).accountId, req.params.id)),
  });

  r.put('/api/vaults/:id', {
    config,
    schema: {
      tags,
      summary: 'Rename a vault',
      params: IdParam,
      body: VaultFields,
      response: { 200: Vault, 404: ErrorBody, 422: ErrorBody },
    },
    handler: async (req) =>
      vaults.shapeVault(
        await vaults.renameVault(deps.sql, actorOf(requirePrincipal(req)), req.params.id, req.body.name),
      ),
  });

  r.delete('/api/vaults/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete a vault and its secrets; retires persistent sandboxes built with it',
      params: IdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await vaults.deleteVault(deps.sql, actorOf(requirePrincipal(req)), req.params.id, deps.retireSandboxes);
      return reply.code(204).send(null);
    },
  });

  secretRoutes(app, deps, 'vault');
}
