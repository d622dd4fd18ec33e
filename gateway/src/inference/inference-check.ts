import type { InferenceProvider } from '@svc/core';
import { request } from 'undici';

export interface ProviderBaseUrls {
  anthropic: string;
  openai: string;
  gemini: string;
}

/** The outcome of pinging a provider with a credential. */
export type CheckResult =
  | { ok: true }
  | { ok: false; reason: 'invalid'; providerStatus: number }
  | { ok: false; reason: 'network'; providerStatus?: number }
  | { ok: false; reason: 'timeout' };

/**
 * The cheapest authenticated read each provider offers: listing models. Each request carries
 * the credential the way that provider expects it.
 */
function probe(provider: InferenceProvider, value: string, base: ProviderBaseUrls) {
  const trim = (u: string) => u.replace(/\/$/, '');
  switch (provider) {
    case 'anthropic_api_key':
      return {
        url: `${trim(base.anthropic)}/v1/models?limit=1`,
        headers: { 'x-api-key': value, 'anthropic-version': '2023-06-01' },
      };
    case 'claude_code_oauth_token':
      return {
        url: `${trim(base.anthropic)}/v1/models?limit=1`,
        headers: {
          authorization: `Bearer ${value}`,
          'anthropic-version': '2023-06-01',
          'anthropic-beta': 'oauth-2025-04-20',
        },
      };
    case 'openai_api_key':
      return { url: `${trim(base.openai)}/v1/models`, headers: { authorization: `Bearer ${value}` } };
    case 'gemini_api_key':
      return { url: `${trim(base.gemini)}/v1beta/models?pageSize=1`, headers: { 'x-goog-api-key': value } };
  }
}

/**
 * Pings the provider. 2xx is valid; 400, 401, 403 are the provider rejecting the credential
 * (`invalid`, with its status); any other answer or a connection failure is `network`; no
 * answer within `timeoutMs` is `timeout`. Never logs or returns the credential.
 */
export async function checkInferenceCredential(
  provider: InferenceProvider,
  value: string,
  base: ProviderBaseUrls,
  timeoutMs: number,
): Promise<CheckResult> {
  const { url, headers } = probe(provider, value, base);
  try {
    const res = await request(url, {
      method: 'GET',
      headers,
      signal: AbortSignal.timeout(timeoutMs),
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
    await res.body.dump();
    if (res.statusCode >= 200 && res.statusCode < 300) return { ok: true };
    if (res.statusCode === 400 || res.statusCode === 401 || res.statusCode === 403) {
      return { ok: false, reason: 'invalid', providerStatus: res.statusCode };
    }
    return { ok: false, reason: 'network', providerStatus: res.statusCode };
  } catch (err) {
    const name = (err as Error).name;
    const code = (err as { code?: string }).code;
    if (
      name === 'TimeoutError' ||
      name === 'AbortError' ||
      code === 'UND_ERR_HEADERS_TIMEOUT' ||
      code === 'UND_ERR_BODY_TIMEOUT'
    ) {
      return { ok: false, reason: 'timeout' };
    }
    return { ok: false, reason: 'network' };
  }
}
