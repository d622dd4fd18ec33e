import { ErrorBody, IdParam, listOf, Sandbox, SandboxQuery } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { actorOf } from '../../services/principal.ts';
import * as sandboxes from '../../services/sandboxes.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['sandboxes'];

export function sandboxRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };
  const offlineAfterMs = deps.config.RUNNER_GRACE_MS;

  r.get('/api/sandboxes', {
    config,
    schema: {
      tags,
      summary: 'List sandboxes, newest first',
      description:
        '`status` filters (comma-separated); a value outside provisioning, ready, suspended, terminated, failed is 400 `invalid_status`. A sandbox is `provisioning` until its runner reports the build done, then `ready` (or `failed`).',
      querystring: SandboxQuery,
      errors: ['invalid_status'],
      response: { 200: listOf(Sandbox), 400: ErrorBody },
    },
    handler: async (req) => ({
      data: (await sandboxes.listSandboxes(deps.sql, requirePrincipal(req).accountId, req.query.status)).map((v) =>
        sandboxes.shapeSandbox(v, offlineAfterMs, deps.launch.providers),
      ),
    }),
  });

  r.get('/api/sandboxes/:id', {
    config,
    schema: {
      tags,
      summary: 'One sandbox, with its conversations and whether each is mid-turn',
      description:
        "Its status, provider, mode and identity (agent, environment, vault), and for each conversation on it whether a turn is running. 404 `sandbox_not_found` for an unknown sandbox or another account's.",
      operationId: 'getSandbox',
      params: IdParam,
      errors: ['sandbox_not_found'],
      response: { 200: Sandbox, 404: ErrorBody },
    },
    handler: async (req) =>
      sandboxes.shapeSandbox(
        await sandboxes.getSandbox(deps.sql, requirePrincipal(req).accountId, req.params.id),
        offlineAfterMs,
        deps.launch.providers,
      ),
  });

  r.delete('/api/sandboxes/:id', {
    config,
    schema: {
      tags,
      summary: 'Reset a persistent sandbox: its machine is destroyed, its conversations kept',
      operationId: 'resetSandbox',
      description:
        'The next prompt on any of its conversations builds a clean machine for the same agent, environment and vault (the sandbox stays `ready`). 422 `sandbox_not_resettable` for an ephemeral, terminated or failed sandbox; 409 `sandbox_mid_turn` while a conversation on it runs a turn (its `conversations` names them); 503 `provisioning` while its first machine is being built; 503 `runner_offline` while its runner is away.',
      params: IdParam,
      errors: ['sandbox_not_found', 'sandbox_mid_turn', 'sandbox_not_resettable', 'provisioning', 'runner_offline'],
      response: { 204: z.null(), 404: ErrorBody, 409: ErrorBody, 422: ErrorBody, 503: ErrorBody },
    },
    handler: async (req, reply) => {
      await sandboxes.resetSandbox(
        { sql: deps.sql, fabric: deps.fabric, logger: deps.log, providers: deps.launch.providers },
        actorOf(requirePrincipal(req)),
        req.params.id,
      );
      return reply.code(204).send(null);
    },
  });
}
