import { AvatarGenerate, AvatarImage, Catalog, ErrorBody } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { catalog, generateAvatar } from '../../services/catalog.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

export function catalogRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const apps = { conversations: deps.config.APP_CONVERSATIONS_URL ?? null, team: deps.config.APP_TEAM_URL ?? null };

  r.get('/api/catalog', {
    config: { auth: 'user' },
    schema: {
      tags: ['agents'],
      summary: 'Runtimes, model suggestions, sandbox providers, package managers, avatar bases and moods, apps',
      operationId: 'getCatalog',
      description: 'Model lists are suggestions only; clients build links from `apps`, never against the API host.',
      response: { 200: Catalog },
    },
    handler: async () => catalog(apps, deps.launch.providers),
  });

  r.post('/api/avatars/generate', {
    config: { auth: 'user' },
    schema: {
      tags: ['agents'],
      summary: "Generate an avatar with the tenant's own OpenAI credential",
      description:
        "Draws a PNG from a `base` and a `mood` of the catalog with the account's OpenAI credential and returns it base64-encoded; nothing is stored (send it to PUT /api/agents/{id}/avatar). 422 `no_openai_key` without that credential; 424 `provider_error`, 502 `network` and 504 `timeout` when OpenAI fails.",
      operationId: 'generateAvatar',
      body: AvatarGenerate,
      errors: ['no_openai_key', 'provider_error', 'network', 'timeout'],
      response: { 200: AvatarImage, 422: ErrorBody, 424: ErrorBody, 502: ErrorBody, 504: ErrorBody },
    },
    handler: async (req) =>
      generateAvatar(
        {
          sql: deps.sql,
          keyring: deps.keyring,
          openaiBaseUrl: deps.config.OPENAI_BASE_URL,
          model: deps.config.AVATAR_IMAGE_MODEL,
          timeoutMs: deps.config.AVATAR_TIMEOUT_MS,
        },
        actorOf(requirePrincipal(req)),
        req.body.base,
        req.body.mood,
      ),
  });
}
