import { EnvironmentSecret, ErrorBody, IdParam, listOf, SecretUpsert, VaultSecret, VaultSecretUpsert } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { getEnvironment } from '../../services/environments.ts';
import { actorOf } from '../../services/principal.ts';
import * as secrets from '../../services/secrets.ts';
import { getVault } from '../../services/vaults.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const KeyParam = IdParam.extend({ key: z.string().max(128) });

/**
 * The secrets routes of environments and vaults, one definition for both owners: list keys,
 * upsert by key (write-only value; vaults also take `expires_at`), delete by key. The owner
 * must be the caller's (404 otherwise) before anything else happens.
 */
export function secretRoutes(app: FastifyInstance, deps: ApiDeps, owner: secrets.SecretOwner): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };
  const base = owner === 'environment' ? '/api/environments/:id/secrets' : '/api/vaults/:id/secrets';
  const tags = [owner === 'environment' ? 'environments' : 'vaults'];
  const Owner = owner === 'environment' ? 'Environment' : 'Vault';
  const Entry = owner === 'environment' ? EnvironmentSecret : VaultSecret;
  const Upsert = owner === 'environment' ? SecretUpsert : VaultSecretUpsert;
  const ownerOf = (accountId: string, id: string) =>
    owner === 'environment' ? getEnvironment(deps.sql, accountId, id) : getVault(deps.sql, accountId, id);

  r.get(base, {
    config,
    schema: {
      tags,
      summary: `Secret keys of ${owner === 'environment' ? 'an environment' : 'a vault, with their expiry'} (values are never returned)`,
      description: `404 for an unknown ${owner} or another account's.${owner === 'vault' ? ' An expired secret stays listed (`expired: true`) but is not placed into sandboxes built after its expiry.' : ''}`,
      operationId: `list${Owner}Secrets`,
      params: IdParam,
      response: { 200: listOf(Entry), 404: ErrorBody },
    },
    handler: async (req) => {
      const p = requirePrincipal(req);
      await ownerOf(p.accountId, req.params.id);
      return {
        data: (await secrets.listSecrets(deps.sql, owner, p.accountId, req.params.id)) as z.infer<typeof VaultSecret>[],
      };
    },
  });

  r.post(base, {
    config,
    schema: {
      tags,
      summary: `Set a secret (upsert by key)${owner === 'vault' ? ', optionally expiring' : ''}; the value is write-only`,
      description: `201 when the key is new, 200 when it replaced a value. The value is encrypted at rest and never returned; placed in a sandbox, a value of 8 bytes or more is redacted from its output. 404 for an unknown ${owner} or another account's.`,
      operationId: `set${Owner}Secret`,
      params: IdParam,
      body: Upsert,
      response: { 200: Entry, 201: Entry, 404: ErrorBody },
    },
    handler: async (req, reply) => {
      const p = requirePrincipal(req);
      await ownerOf(p.accountId, req.params.id);
      const body = req.body as z.infer<typeof VaultSecretUpsert>;
      const [written] = await secrets.writeSecrets(
        { sql: deps.sql, keyring: deps.keyring },
        actorOf(p),
        owner,
        req.params.id,
        [{ key: body.key, value: body.value, expiresAt: body.expires_at ? new Date(body.expires_at) : null }],
      );
      if (!written?.row) throw new Error('secret write returned no row');
      return reply
        .code(written.outcome === 'created' ? 201 : 200)
        .send(secrets.shapeSecret(owner, written.row) as z.infer<typeof VaultSecret>);
    },
  });

  r.delete(`${base}/:key`, {
    config,
    schema: {
      tags,
      summary: 'Delete a secret',
      description: `404 for an unknown ${owner}, another account's, or a key it does not hold.`,
      operationId: `delete${Owner}Secret`,
      params: KeyParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      const p = requirePrincipal(req);
      await ownerOf(p.accountId, req.params.id);
      await secrets.deleteSecret(deps.sql, actorOf(p), owner, req.params.id, req.params.key);
      return reply.code(204).send(null);
    },
  });
}
