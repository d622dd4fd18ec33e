import { z } from 'zod';

export const ApplyKind = z.enum(['Environment', 'Vault', 'Agent']);

export const ApplyBody = z
  .object({
    resources: z
      .array(
        z
          .object({
            kind: ApplyKind,
            name: z.string().trim().min(1).max(100),
            spec: z.record(z.string(), z.unknown()).default({}),
          })
          .strict(),
      )
      .max(200),
  })
  .strict();

export const SecretOutcome = z.enum(['created', 'updated', 'unchanged', 'error']);

export const ApplyResult = z
  .object({
    kind: ApplyKind,
    name: z.string(),
    action: z.enum(['created', 'updated', 'error']),
    id: z.string().nullable(),
    errors: z.record(z.string(), z.array(z.string())).optional().meta({ description: 'Field path to messages.' }),
    secrets: z
      .record(z.string(), z.object({ outcome: SecretOutcome, error: z.string().optional() }))
      .optional()
      .meta({ description: 'One outcome per secret key; values are never echoed.' }),
  })
  .meta({ id: 'ApplyResult' });

export const ApplyResponse = z.object({ data: z.array(ApplyResult) });
