import { ApplyBody, ApplyResponse } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { applyManifest } from '../../services/apply.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

export function applyRoutes(app: FastifyInstance, deps: ApiDeps): void {
  app.withTypeProvider<ZodTypeProvider>().post('/api/apply', {
    config: { auth: 'user' },
    schema: {
      tags: ['apply'],
      summary: 'Upsert environments, vaults and agents by name from one manifest',
      operationId: 'applyManifest',
      description:
        'Applied in the order environments, vaults, agents; each resource best-effort in its own transaction. Environment spec: environment fields plus `secrets` (map). Vault spec: `secrets` (map of key to value or {value, expires_at}). Agent spec: agent fields with `environment` naming an environment of the manifest or the account. An existing resource is replaced by its spec. Always 200 with one result per resource, in manifest order; secret values are never echoed.',
      body: ApplyBody,
      response: { 200: ApplyResponse },
    },
    handler: async (req) => ({
      data: await applyManifest(
        { sql: deps.sql, keyring: deps.keyring, retire: deps.retireSandboxes, providers: deps.launch.providers },
        actorOf(requirePrincipal(req)),
        req.body.resources,
      ),
    }),
  });
}
