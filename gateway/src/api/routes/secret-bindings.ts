import {
  EgressPage,
  EgressQuery,
  ErrorBody,
  IdParam,
  listOf,
  SECRET_BINDING_PRESET_LIST,
  SecretBinding,
  SecretBindingCreate,
  SecretBindingPatch,
  SecretBindingPreset,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { listEgress } from '../../services/egress-log.ts';
import { actorOf } from '../../services/principal.ts';
import * as bindings from '../../services/secret-bindings.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['secret-bindings'];

const LIMITED =
  'Limited access: with the egress credential broker off (EGRESS_BROKER), 404 `not_found` with `broker: "disabled"` in the body.';
const BrokerDisabled = ErrorBody.extend({ broker: z.literal('disabled').optional() });

const HOST_RULES =
  '`host` as in `allowed_hosts` (`api.github.com`, `*.example.com`, optional `:port`); `shape` a preset name or `{header, format}` with `{value}` exactly once in `format` and `header` an HTTP header name (not one that frames the request, such as `host` or `content-length`); `secret_name` an environment variable name.';

/**
 * The broker's routes (SPEC Conventions 6): secret bindings, full-scope credentials only (a
 * sandbox token never reaches them), and a conversation's egress log. With the broker off,
 * each answers 404 `broker: "disabled"` once the caller is authenticated, before its input is
 * read, so nothing of a route shows but its existence.
 */
export function secretBindingRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const brokerOn = deps.config.EGRESS_BROKER === 'on';
  // A route's own onRequest hook runs after the app's, which authenticates.
  const onRequest = async () => {
    if (!brokerOn) throw bindings.brokerDisabled();
  };
  const full = { auth: 'full' as const };

  r.get('/api/secret-bindings', {
    config: full,
    onRequest,
    schema: {
      tags,
      summary: "The account's secret bindings",
      description: `Oldest first: each binding's secret name, host and shape; a binding holds no value. It applies to every environment and vault of the account holding a secret of that name. Needs a full-scope credential. ${LIMITED}`,
      operationId: 'listSecretBindings',
      response: { 200: listOf(SecretBinding), 404: BrokerDisabled },
    },
    handler: async (req) => ({ data: await bindings.listBindings(deps.sql, requirePrincipal(req).accountId) }),
  });

  r.get('/api/secret-bindings/presets', {
    config: full,
    onRequest,
    schema: {
      tags,
      summary: 'The shapes a secret binding can take',
      description: `Each preset \`{name, header, format, hosts}\`: ${SECRET_BINDING_PRESET_LIST.map((p) => `\`${p.name}\` (\`${p.header}: ${p.format}\`${p.hosts.length ? ` for ${p.hosts.join(', ')}` : ''})`).join(', ')}. \`basic\` takes a secret of the form \`user:password\` and writes it base64-encoded. \`hosts\` is who the preset is meant for (empty: any); a binding names its own host. Needs a full-scope credential. ${LIMITED}`,
      operationId: 'listSecretBindingPresets',
      response: { 200: listOf(SecretBindingPreset), 404: BrokerDisabled },
    },
    handler: async () => ({ data: bindings.listPresets() }),
  });

  r.post('/api/secret-bindings', {
    config: full,
    onRequest,
    schema: {
      tags,
      summary: 'Bind a secret, by name, to a host',
      description: `A sandbox holding a secret of that name sees a placeholder in its variable; the broker writes the value into the shape's header of requests to that host only. ${HOST_RULES} A field outside these is 422 \`validation_failed\`. 409 \`binding_exists\` when the account already binds that secret name to that host. Audited (\`secret_binding.created\`). Needs a full-scope credential. ${LIMITED}`,
      operationId: 'createSecretBinding',
      body: SecretBindingCreate,
      errors: ['binding_exists'],
      response: { 201: SecretBinding, 404: BrokerDisabled, 422: ErrorBody },
    },
    handler: async (req, reply) =>
      reply.code(201).send(await bindings.createBinding(deps.sql, actorOf(requirePrincipal(req)), req.body)),
  });

  r.patch('/api/secret-bindings/:id', {
    config: full,
    onRequest,
    schema: {
      tags,
      summary: 'Update a secret binding (the fields present)',
      description: `The rules of create apply to each field present; 409 \`binding_exists\` when the new name and host are another binding's. 404 for an unknown binding or another account's. Audited (\`secret_binding.updated\`). Needs a full-scope credential. ${LIMITED}`,
      operationId: 'updateSecretBinding',
      params: IdParam,
      body: SecretBindingPatch,
      errors: ['binding_exists'],
      response: { 200: SecretBinding, 404: BrokerDisabled, 422: ErrorBody },
    },
    handler: async (req) => bindings.updateBinding(deps.sql, actorOf(requirePrincipal(req)), req.params.id, req.body),
  });

  r.delete('/api/secret-bindings/:id', {
    config: full,
    onRequest,
    schema: {
      tags,
      summary: 'Delete a secret binding',
      description: `The secret is no longer bound to the host. Egress rows that named the binding keep its id. 404 as for PATCH. Audited (\`secret_binding.deleted\`). Needs a full-scope credential. ${LIMITED}`,
      operationId: 'deleteSecretBinding',
      params: IdParam,
      response: { 204: z.null(), 404: BrokerDisabled },
    },
    handler: async (req, reply) => {
      await bindings.deleteBinding(deps.sql, actorOf(requirePrincipal(req)), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.get('/api/conversations/:id/egress', {
    config: { auth: 'user' },
    onRequest,
    schema: {
      tags: ['conversations'],
      summary: "The requests that left a conversation's sandbox through the broker, newest first",
      description: `Each row: \`host\`, \`port\`, \`method\`, the binding whose secret was written (\`binding_id\`, null for none), the \`status\` the host answered and \`latency_ms\`; a refused request has \`refused: true\` and its \`reason\`. Never a path, query or body. \`limit\` default 100, max 1000; \`before\` takes \`meta.next_cursor\` to page backwards while \`has_more\` is true. Kept BROKER_LOG_RETENTION_HOURS (default 72) after the conversation ends. 404 for an unknown conversation or another account's. ${LIMITED}`,
      operationId: 'listConversationEgress',
      params: IdParam,
      querystring: EgressQuery,
      response: { 200: EgressPage, 404: BrokerDisabled },
    },
    handler: async (req) => listEgress(deps.sql, requirePrincipal(req).accountId, req.params.id, req.query),
  });
}
