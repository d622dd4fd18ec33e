import { Environment, EnvironmentCreate, EnvironmentPatch, ErrorBody, IdParam, listOf } from '@svc/core';
import { environments as rows } from '@svc/db';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import * as envs from '../../services/environments.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';
import { secretRoutes } from './secrets.ts';

const tags = ['environments'];

export function environmentRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };

  r.get('/api/environments', {
    config,
    schema: {
      tags,
      summary: 'List environments',
      description:
        'Every environment of the account, with its packages, repositories and networking; secret values are never included.',
      operationId: 'listEnvironments',
      response: { 200: listOf(Environment) },
    },
    handler: async (req) => ({
      data: (await rows.listEnvironments(deps.sql, requirePrincipal(req).accountId)).map(envs.shapeEnvironment),
    }),
  });

  r.post('/api/environments', {
    config,
    schema: {
      tags,
      summary: 'Create an environment',
      description:
        'packages: `apt` and `npm` are lists of package names (installed); other keys are stored and ignored. A networking_config makes networking_type `limited` unless given.',
      body: EnvironmentCreate,
      response: { 201: Environment, 422: ErrorBody },
    },
    handler: async (req, reply) => {
      const row = await envs.createEnvironment(deps.sql, actorOf(requirePrincipal(req)), req.body);
      return reply.code(201).send(envs.shapeEnvironment(row));
    },
  });

  r.get('/api/environments/:id', {
    config,
    schema: {
      tags,
      summary: 'One environment',
      description: "404 for an unknown environment or another account's.",
      operationId: 'getEnvironment',
      params: IdParam,
      response: { 200: Environment, 404: ErrorBody },
    },
    handler: async (req) =>
      envs.shapeEnvironment(await envs.getEnvironment(deps.sql, requirePrincipal(req).accountId, req.params.id)),
  });

  for (const method of ['PUT', 'PATCH'] as const) {
    r.route({
      method,
      url: '/api/environments/:id',
      config,
      schema: {
        tags,
        summary: 'Update an environment (the fields present)',
        description:
          'PUT and PATCH behave the same: fields absent keep their values. A `networking_config` sent without `networking_type` sets it to `limited` (`unrestricted` for null). 422 `validation_failed` when the name is taken by another environment.',
        operationId: method === 'PATCH' ? 'updateEnvironment' : 'putEnvironment',
        params: IdParam,
        body: EnvironmentPatch,
        response: { 200: Environment, 404: ErrorBody, 422: ErrorBody },
      },
      handler: async (req) =>
        envs.shapeEnvironment(
          await envs.updateEnvironment(deps.sql, actorOf(requirePrincipal(req)), req.params.id, req.body),
        ),
    });
  }

  r.delete('/api/environments/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete an environment; retires persistent sandboxes built on it',
      operationId: 'deleteEnvironment',
      description: '409 `environment_in_use` while agents use it.',
      params: IdParam,
      errors: ['not_found', 'environment_in_use'],
      response: { 204: z.null(), 404: ErrorBody, 409: ErrorBody },
    },
    handler: async (req, reply) => {
      await envs.deleteEnvironment(deps.sql, actorOf(requirePrincipal(req)), req.params.id, deps.retireSandboxes);
      return reply.code(204).send(null);
    },
  });

  secretRoutes(app, deps, 'environment');
}
