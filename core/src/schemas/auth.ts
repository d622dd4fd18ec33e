import { z } from 'zod';
import { Timestamp } from './common.ts';

export const Email = z
  .string()
  .trim()
  .max(254)
  .pipe(z.email({ message: 'must be an email address' }))
  .transform((s) => s.toLowerCase());

/** Passwords: at least 10 characters, at most 256 (scrypt input stays bounded). */
export const Password = z.string().min(10, 'must be at least 10 characters').max(256);

export const Credentials = z.object({ email: Email, password: z.string().min(1).max(256) });
export const Registration = z.object({ email: Email, password: Password });

export const Scope = z.enum(['full', 'standard']).meta({
  description:
    '`full` may reach every route; `standard` may not change the password or email, delete the account, touch inference credentials, secret bindings, webhooks or admin routes.',
});

export const ApiKeyCreate = z
  .object({
    name: z.string().trim().min(1).max(100).optional(),
    scope: Scope.default('full'),
    expires_in_days: z.int().min(1).max(3650).nullable().optional().meta({
      description: 'Days until the key stops working; absent or null means it never expires.',
    }),
  })
  .strict();

export const ApiKey = z
  .object({
    id: z.string(),
    name: z.string(),
    prefix: z.string().meta({ description: 'The first characters of the key, to recognise it.' }),
    scope: Scope,
    created_at: Timestamp,
    expires_at: Timestamp.nullable(),
    last_used_at: Timestamp.nullable(),
  })
  .meta({ id: 'ApiKey' });

export const ApiKeyWithSecret = ApiKey.extend({
  key: z.string().meta({ description: 'The plaintext key; shown only in this response.' }),
}).meta({ id: 'ApiKeyWithSecret' });

export const Role = z.enum(['user', 'admin']);

export const Identity = z
  .object({
    id: z.string(),
    email: z.string(),
    created_at: Timestamp,
    email_verified: z.boolean(),
    onboarding_state: z.string(),
    onboarding_completed: z.boolean(),
    comped: z.boolean().nullable().meta({ description: 'Null while payment is off.' }),
    brokered: z.boolean().meta({
      description:
        'True when the account runs behind the egress credential broker: bound secrets never enter its sandboxes, and the secret-binding and egress routes answer.',
    }),
    role: Role,
    actor: z.enum(['ui', 'api', 'sprite']).meta({ description: 'How this request authenticated.' }),
    scope: Scope,
  })
  .meta({ id: 'Identity' });

export const TokenBody = z.object({ token: z.string().min(1).max(512) });
export const ForgotBody = z.object({ email: z.string().trim().max(254) });
export const ResetBody = z.object({ token: z.string().min(1).max(512), password: Password });
export const ResendBody = z.object({ email: z.string().trim().max(254) });
export const PasswordChange = z.object({ current_password: z.string().min(1).max(256), new_password: Password });
export const PasswordChanged = z.object({
  sessions_invalidated: z.int().meta({ description: 'Browser sessions signed out.' }),
  api_keys_revoked: z.int().meta({ description: 'Always 0: a password change keeps API keys.' }),
});
export const EmailChange = z.object({ new_email: Email, current_password: z.string().min(1).max(256) });

/** The neutral answer of routes that must not reveal whether an address exists. */
export const Accepted = z.object({ status: z.string(), message: z.string() });
