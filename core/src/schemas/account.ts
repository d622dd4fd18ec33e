import { z } from 'zod';
import { Timestamp } from './common.ts';

export const Onboarding = z
  .object({ state: z.string(), completed: z.boolean(), completed_at: Timestamp.nullable() })
  .meta({ id: 'Onboarding' });

export const InferenceProvider = z.enum([
  'anthropic_api_key',
  'claude_code_oauth_token',
  'openai_api_key',
  'gemini_api_key',
]);
export type InferenceProvider = z.infer<typeof InferenceProvider>;

export const InferenceCredentialPut = z.object({
  value: z.string().max(4096),
  validate: z.boolean().default(false),
});

export const InferenceCredentialStatus = z
  .object({ provider: InferenceProvider, set: z.boolean(), updated_at: Timestamp.nullable() })
  .meta({ id: 'InferenceCredentialStatus' });

export const AccountDelete = z.object({ confirm: z.string().max(254) });
