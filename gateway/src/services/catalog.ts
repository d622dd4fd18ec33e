import {
  ApiError,
  AVATAR_BASES,
  AVATAR_MOODS,
  MODEL_PROVIDERS,
  PACKAGE_MANAGERS,
  RUNTIME_INFO,
  RUNTIME_PROVIDERS,
  RUNTIMES,
  SANDBOX_MODES,
  sniffImage,
} from '@svc/core';
import type { Sql } from '@svc/db';
import { generatePng } from '../inference/image-generation.ts';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import type { Keyring } from '../secrets/keyring.ts';
import { recordAudit } from './audit.ts';
import { revealCredential } from './inference-credentials.ts';
import type { ActorRef } from './principal.ts';

/**
 * `GET /api/catalog`. `sandbox_providers` are the ones this instance offers that an agent may
 * name; an agent naming none gets `sandbox_provider_default`.
 */
export function catalog(apps: { conversations: string | null; team: string | null }, providers: SandboxProviders) {
  return {
    runtimes: RUNTIMES.map((id) => ({
      id,
      name: RUNTIME_INFO[id].name,
      providers: [...RUNTIME_PROVIDERS[id]],
      models: RUNTIME_INFO[id].models,
    })),
    model_providers: [...MODEL_PROVIDERS],
    sandbox_providers: providers.nameable,
    sandbox_provider_default: providers.defaultName,
    sandbox_modes: [...SANDBOX_MODES],
    package_managers: [...PACKAGE_MANAGERS],
    avatar: { bases: [...AVATAR_BASES], moods: [...AVATAR_MOODS] },
    apps,
  };
}

export interface AvatarGenerationDeps {
  sql: Sql;
  keyring: Keyring;
  openaiBaseUrl: string;
  model: string;
  timeoutMs: number;
}

/** A generated avatar from the tenant's own OpenAI key; 422 `no_openai_key` without one. */
export async function generateAvatar(deps: AvatarGenerationDeps, who: ActorRef, base: string, mood: string) {
  const apiKey = await revealCredential(deps, who.accountId, 'openai_api_key');
  if (!apiKey) throw new ApiError('no_openai_key');
  const prompt = `A friendly square avatar icon of a ${mood} ${base}, flat illustration, centered, plain background, no text.`;
  const png = await generatePng(
    { baseUrl: deps.openaiBaseUrl, apiKey, model: deps.model, timeoutMs: deps.timeoutMs },
    prompt,
  );
  if (sniffImage(png) !== 'image/png') {
    throw new ApiError('provider_error', 'OpenAI returned something that is not a PNG.', {
      extra: { channel: 'openai' },
    });
  }
  await recordAudit(deps.sql, who, 'avatar.generated', {}, { base, mood, bytes: png.length });
  return { data: png.toString('base64'), media_type: 'image/png' as const };
}
