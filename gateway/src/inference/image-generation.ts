import { ApiError } from '@svc/core';
import { request } from 'undici';

/**
 * Generates one square PNG through OpenAI's Images API with the tenant's own key
 * (`POST /v1/images/generations`; gpt-image models answer base64 in `data[0].b64_json`).
 * Failures: the provider refusing is 424 `provider_error` (channel `openai`, with its status),
 * no connection 502 `network`, no answer in time 504 `timeout`. The key is never logged.
 */
export async function generatePng(
  opts: { baseUrl: string; apiKey: string; model: string; timeoutMs: number },
  prompt: string,
): Promise<Buffer> {
  let res: Awaited<ReturnType<typeof request>>;
  try {
    res = await request(`${opts.baseUrl.replace(/\/$/, '')}/v1/images/generations`, {
      method: 'POST',
      headers: { authorization: `Bearer ${opts.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: opts.model, prompt, n: 1, size: '1024x1024' }),
      signal: AbortSignal.timeout(opts.timeoutMs),
      headersTimeout: opts.timeoutMs,
      bodyTimeout: opts.timeoutMs,
    });
  } catch (err) {
    const name = (err as Error).name;
    if (name === 'TimeoutError' || name === 'AbortError') throw new ApiError('timeout');
    throw new ApiError('network', 'OpenAI could not be reached.');
  }
  const text = await res.body.text();
  if (res.statusCode < 200 || res.statusCode >= 300) {
    throw new ApiError('provider_error', `OpenAI answered ${res.statusCode}.`, {
      extra: { channel: 'openai', provider_status: res.statusCode },
    });
  }
  const b64 = (JSON.parse(text) as { data?: { b64_json?: string }[] }).data?.[0]?.b64_json;
  if (!b64) throw new ApiError('provider_error', 'OpenAI returned no image.', { extra: { channel: 'openai' } });
  return Buffer.from(b64, 'base64');
}
