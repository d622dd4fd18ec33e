import { ErrorBody, IdParam, listOf, Runner, RunnerCreated, RunnerFields } from '@svc/core';
import { runners as rows } from '@svc/db';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { actorOf } from '../../services/principal.ts';
import * as runners from '../../services/runners.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['runners'];

/**
 * Self-hosted runners (SPEC names them without routes; these are ours, in OpenAPI). A runner
 * connects to `wss://<base>/api/runners/connect` with the token shown once at creation.
 */
export function runnerRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };
  const offlineAfterMs = deps.config.RUNNER_GRACE_MS;

  r.get('/api/runners', {
    config,
    schema: {
      tags,
      summary: 'List runners with their presence',
      description:
        "`online` is true while the runner's connection is live (within RUNNER_GRACE_MS of its last heartbeat); `hostname`, `path` and `version` are what it reported when it last connected.",
      operationId: 'listRunners',
      response: { 200: listOf(Runner) },
    },
    handler: async (req) => ({
      data: (await rows.listRunners(deps.sql, requirePrincipal(req).accountId)).map((row) =>
        runners.shapeRunner(row, offlineAfterMs),
      ),
    }),
  });

  r.post('/api/runners', {
    // A runner receives what its turns need (secrets, inference keys): a full-scope key registers one.
    config: { auth: 'full' as const },
    schema: {
      tags,
      summary: 'Register a runner; its token is shown once',
      operationId: 'createRunner',
      description:
        'Run it on the machine: install svc-runner from the tarball of a release of this service (`npm install -g ./svc-runner-<version>.tgz`; it is not on the npm registry, so never install it by name), keep the token in a file only you can read, and start `svc-runner --url <base> --token-file <file> --root <dir>`. Only a hash of the token is kept. Needs a full-scope key (403 `forbidden` otherwise): a runner receives the secrets and inference keys of the turns it runs.',
      body: RunnerFields,
      response: { 201: RunnerCreated, 403: ErrorBody, 422: ErrorBody },
    },
    handler: async (req, reply) => {
      const { row, token } = await runners.createRunner(deps.sql, actorOf(requirePrincipal(req)), req.body.name);
      return reply.code(201).send({ ...runners.shapeRunner(row, offlineAfterMs), token });
    },
  });

  r.delete('/api/runners/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete a runner: its token stops working and its connection is closed',
      description:
        "Its live connection is closed (close code 4002) and its token refused from then on. 404 for an unknown runner or another account's.",
      operationId: 'deleteRunner',
      params: IdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await runners.deleteRunner(deps.sql, deps.fabric, actorOf(requirePrincipal(req)), req.params.id);
      return reply.code(204).send(null);
    },
  });
}
