import {
  AccountDelete,
  ErrorBody,
  InferenceCredentialPut,
  InferenceCredentialStatus,
  listOf,
  Onboarding,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import * as accounts from '../../services/accounts.ts';
import * as inference from '../../services/inference-credentials.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['account'];
const ProviderParam = z.object({ provider: z.string().max(100) });

export function accountRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();

  r.get('/api/account/onboarding', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'Onboarding state',
      description: "Where the account is in the console's first-run steps, and whether they are completed.",
      operationId: 'getOnboarding',
      response: { 200: Onboarding, 401: ErrorBody },
    },
    handler: async (req) => accounts.onboarding(deps.sql, requirePrincipal(req)),
  });

  r.post('/api/account/onboarding/complete', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'Mark onboarding complete; idempotent',
      description: 'Sets `completed` and `completed_at` once; repeating it changes nothing.',
      operationId: 'completeOnboarding',
      response: { 200: Onboarding, 401: ErrorBody },
    },
    handler: async (req) => accounts.completeOnboarding(deps.sql, requirePrincipal(req)),
  });

  r.get('/api/account/inference-credentials', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Which inference credentials are set (values are never returned)',
      description:
        'One entry per provider (anthropic_api_key, claude_code_oauth_token, openai_api_key, gemini_api_key) saying whether it is set. Needs a full-scope credential.',
      operationId: 'listInferenceCredentials',
      response: { 200: listOf(InferenceCredentialStatus), 401: ErrorBody, 403: ErrorBody },
    },
    handler: async (req) => ({ data: await inference.listCredentials(deps.sql, requirePrincipal(req).accountId) }),
  });

  r.put('/api/account/inference-credentials/:provider', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Store an inference credential, optionally pinging the provider first',
      operationId: 'setInferenceCredential',
      description:
        'Providers: anthropic_api_key, claude_code_oauth_token, openai_api_key, gemini_api_key. 422 `invalid` when the provider rejects it (`provider_status`), the value is blank or the provider unknown; 502 `network`; 504 `timeout`.',
      params: ProviderParam,
      body: InferenceCredentialPut,
      errors: ['invalid', 'network', 'timeout'],
      response: {
        200: InferenceCredentialStatus,
        400: ErrorBody,
        401: ErrorBody,
        403: ErrorBody,
        422: ErrorBody,
        502: ErrorBody,
        504: ErrorBody,
      },
    },
    handler: async (req) =>
      inference.putCredential(
        { sql: deps.sql, keyring: deps.keyring, check: deps.inference },
        requirePrincipal(req),
        req.params.provider,
        req.body,
      ),
  });

  r.delete('/api/account/inference-credentials/:provider', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Clear an inference credential',
      description:
        'Idempotent: clearing a provider that has no credential is also 204. 422 `invalid` for an unknown provider. Needs a full-scope credential.',
      operationId: 'deleteInferenceCredential',
      params: ProviderParam,
      errors: ['invalid'],
      response: { 204: z.null(), 401: ErrorBody, 403: ErrorBody, 422: ErrorBody },
    },
    handler: async (req, reply) => {
      await inference.deleteCredential(deps.sql, requirePrincipal(req), req.params.provider);
      return reply.code(204).send(null);
    },
  });

  r.delete('/api/account', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Delete the account irreversibly: every resource and the tenant encryption key',
      description:
        'Before the answer, its sandboxes are destroyed (each runner is told; local machines are stopped and their disk removed), its runners are disconnected and its open event streams ended (on every node), and its live event log is dropped.',
      body: AccountDelete,
      response: { 204: z.null(), 400: ErrorBody, 401: ErrorBody, 403: ErrorBody, 422: ErrorBody },
    },
    handler: async (req, reply) => {
      const erasure = {
        sql: deps.sql,
        fabric: deps.fabric,
        providers: deps.launch.providers,
        eventLog: deps.eventLog,
        logger: deps.log,
      };
      await accounts.deleteAccount(deps.accounts, erasure, requirePrincipal(req), req.body.confirm);
      return reply.code(204).send(null);
    },
  });
}
