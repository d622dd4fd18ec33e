import { z } from 'zod';
import { Timestamp } from './common.ts';

export const VaultFields = z.object({ name: z.string().trim().min(1).max(100) }).strict();

export const Vault = z
  .object({ id: z.string(), name: z.string(), secret_count: z.int(), created_at: Timestamp, updated_at: Timestamp })
  .meta({ id: 'Vault' });

export const VaultSecret = z
  .object({
    id: z.string(),
    key: z.string(),
    expires_at: Timestamp.nullable(),
    expired: z.boolean().meta({ description: 'True once expires_at has passed.' }),
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'VaultSecret' });
