import { ApiError, type InferenceProvider } from '@svc/core';
import { accounts, inferenceCredentials, type Sql } from '@svc/db';
import { checkInferenceCredential, type ProviderBaseUrls } from '../inference/inference-check.ts';
import type { Keyring } from '../secrets/keyring.ts';
import { recordAudit } from './audit.ts';
import { actorOf, type Principal } from './principal.ts';

export const PROVIDERS: readonly InferenceProvider[] = [
  'anthropic_api_key',
  'claude_code_oauth_token',
  'openai_api_key',
  'gemini_api_key',
];

export interface InferenceCheckDeps {
  baseUrls: ProviderBaseUrls;
  timeoutMs: number;
}

const PURPOSE = 'inference';

/** Per provider: set or not, and when. Values are never returned. */
export async function listCredentials(sql: Sql, accountId: string) {
  const rows = await inferenceCredentials.listInferenceCredentials(sql, accountId);
  const byProvider = new Map(rows.map((r) => [r.provider, r]));
  return PROVIDERS.map((provider) => {
    const row = byProvider.get(provider);
    return { provider, set: row !== undefined, updated_at: row?.updated_at.toISOString() ?? null };
  });
}

export function parseProvider(value: string): InferenceProvider {
  if (!(PROVIDERS as readonly string[]).includes(value)) {
    throw new ApiError('invalid', `Unknown provider; use one of ${PROVIDERS.join(', ')}.`, {
      extra: { provider_status: null },
    });
  }
  return value as InferenceProvider;
}

/**
 * Stores a credential encrypted under the account's data key. With `validate`, the provider
 * is pinged first and nothing is stored unless it accepts the credential.
 */
export async function putCredential(
  deps: { sql: Sql; keyring: Keyring; check: InferenceCheckDeps },
  p: Principal,
  providerName: string,
  input: { value: string; validate: boolean },
) {
  const provider = parseProvider(providerName);
  const value = input.value.trim();
  if (value === '') throw new ApiError('invalid', 'The value is blank.', { extra: { provider_status: null } });
  if (input.validate) {
    const result = await checkInferenceCredential(provider, value, deps.check.baseUrls, deps.check.timeoutMs);
    if (!result.ok) {
      if (result.reason === 'invalid') {
        throw new ApiError('invalid', 'The provider rejected the credential.', {
          extra: { provider_status: result.providerStatus },
        });
      }
      if (result.reason === 'network') {
        throw new ApiError('network', 'The provider could not be reached.', {
          extra: { provider_status: result.providerStatus ?? null },
        });
      }
      throw new ApiError('timeout');
    }
  }
  const account = await accounts.findAccountById(deps.sql, p.accountId);
  if (!account) throw new ApiError('unauthorized');
  const sealed = deps.keyring.encrypt(account.id, account.data_key, `${PURPOSE}:${provider}`, value);
  await inferenceCredentials.upsertInferenceCredential(deps.sql, account.id, provider, sealed);
  await recordAudit(
    deps.sql,
    actorOf(p),
    'inference_credential.set',
    { type: 'inference_credential', id: provider },
    {
      validated: input.validate,
    },
  );
  return (await listCredentials(deps.sql, account.id)).find((c) => c.provider === provider) as {
    provider: InferenceProvider;
    set: boolean;
    updated_at: string | null;
  };
}

export async function deleteCredential(sql: Sql, p: Principal, providerName: string): Promise<void> {
  const provider = parseProvider(providerName);
  if (await inferenceCredentials.deleteInferenceCredential(sql, p.accountId, provider)) {
    await recordAudit(sql, actorOf(p), 'inference_credential.cleared', { type: 'inference_credential', id: provider });
  }
}

/** The plaintext, for the sandbox environment only (later issues); never for an HTTP answer. */
export async function revealCredential(
  deps: { sql: Sql; keyring: Keyring },
  accountId: string,
  provider: InferenceProvider,
): Promise<string | undefined> {
  const account = await accounts.findAccountById(deps.sql, accountId);
  const row = (await inferenceCredentials.listInferenceCredentials(deps.sql, accountId)).find(
    (r) => r.provider === provider,
  );
  if (!account || !row) return undefined;
  return deps.keyring.decrypt(accountId, account.data_key, `${PURPOSE}:${provider}`, row.ciphertext);
}
