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
    schema: {
      tags,
      summary: 'List vaults',
      description: 'Every vault of the account with its secret count; values are never included.',
      operationId: 'listVaults',
      response: { 200: listOf(Vault) },
    },
    handler: async (req) => ({
      data: (await rows.listVaults(deps.sql, requirePrincipal(req).accountId)).map(vaults.shapeVault),
    }),
  });

  r.post('/api/vaults', {
    config,
    schema: {
      tags,
      summary: 'Create a vault',
      description:
        'A vault is a named set of secrets an agent may be allowed to use (`allowed_vault_ids`). 422 `validation_failed` when the name is taken.',
      operationId: 'createVault',
      body: VaultFields,
      response: { 201: Vault, 422: ErrorBody },
    },
    handler: async (req, reply) =>
      reply
        .code(201)
        .send(vaults.shapeVault(await vaults.createVault(deps.sql, actorOf(requirePrincipal(req)), req.body.name))),
  });

  r.get('/api/vaults/:id', {
    config,
    schema: {
      tags,
      summary: 'One vault',
      description: "404 for an unknown vault or another account's.",
      operationId: 'getVault',
      params: IdParam,
      response: { 200: Vault, 404: ErrorBody },
    },
    handler: async (req) =>
      vaults.shapeVault(await vaults.getVault(deps.sql, requirePrincipal(req).accountId, req.params.id)),
  });

  r.put('/api/vaults/:id', {
    config,
    schema: {
      tags,
      summary: 'Rename a vault',
      description: 'Only the name changes; its secrets stay. 422 `validation_failed` when the name is taken.',
      operationId: 'renameVault',
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
      description:
        'The secrets are destroyed with it. Persistent sandboxes built with the vault are retired, so no later turn runs with its values.',
      operationId: 'deleteVault',
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
