import { z } from 'zod';
import { BINDING_VALUE_SLOT, SECRET_BINDING_PRESET_NAMES } from '../secret-bindings.ts';
import { Timestamp } from './common.ts';
import { AllowedHost, EnvKey } from './environments.ts';

/*
 * Secret bindings (SPEC "Secret bindings", DECISIONS "Sandboxes that hold"): which secret, by
 * name, the runner's proxy writes into which header of requests to which host. A binding holds
 * no value; it applies to every environment and vault holding a secret of that name.
 */

/** Headers that frame or route the request: a binding writing one would break it, not sign it. */
const RESERVED_HEADERS = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'upgrade',
  'te',
  'trailer',
  'proxy-connection',
]);

const HeaderName = z
  .string()
  .min(1)
  .max(100)
  .regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/, 'must be an HTTP header name')
  .refine((h) => !RESERVED_HEADERS.has(h.toLowerCase()), 'names a header that frames the request')
  .meta({ description: 'An HTTP header name (not one that frames the request: host, content-length, ...).' });

const Format = z
  .string()
  .max(1000)
  .regex(/^[\t\x20-\x7e]*$/, 'may hold printable ASCII only (no line breaks)')
  .refine((f) => f.split(BINDING_VALUE_SLOT).length === 2, 'must contain {value} exactly once')
  .meta({ description: 'The header value, holding `{value}` exactly once where the secret goes: `Bearer {value}`.' });

export const SecretBindingPresetName = z.enum(SECRET_BINDING_PRESET_NAMES);

export const SecretBindingCustomShape = z.object({ header: HeaderName, format: Format }).strict();

export const SecretBindingShape = z.union([SecretBindingPresetName, SecretBindingCustomShape]).meta({
  id: 'SecretBindingShape',
  description:
    'A preset name (see GET /api/secret-bindings/presets) or `{header, format}`. `basic` takes a secret of the form `user:password` and sends it base64-encoded.',
});

const BindingHost = AllowedHost.overwrite((h) => h.toLowerCase()).meta({
  description:
    'As in `allowed_hosts`: `api.github.com`, `*.example.com` (any subdomain), optionally `:port`. Stored in lower case.',
});

const SecretName = EnvKey.meta({
  description: 'The name of the secret, in whichever environment or vault holds it (an environment variable name).',
});

/** A binding as listed. */
export const SecretBinding = z
  .object({
    id: z.string(),
    secret_name: z.string(),
    host: z.string(),
    shape: SecretBindingShape,
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'SecretBinding' });

export const SecretBindingCreate = z
  .object({ secret_name: SecretName, host: BindingHost, shape: SecretBindingShape })
  .strict()
  .meta({ example: { secret_name: 'GITHUB_TOKEN', host: 'api.github.com', shape: 'github' } });

export const SecretBindingPatch = z
  .object({ secret_name: SecretName, host: BindingHost, shape: SecretBindingShape })
  .partial()
  .strict();

/** One preset, as `GET /api/secret-bindings/presets` lists it. */
export const SecretBindingPreset = z
  .object({
    name: SecretBindingPresetName,
    header: z.string(),
    format: z.string(),
    hosts: z.array(z.string()).meta({ description: 'The hosts the preset is meant for; empty: any host.' }),
  })
  .meta({ id: 'SecretBindingPreset' });

/** One request that left a sandbox through the broker: no path, query or body. */
export const EgressRow = z
  .object({
    id: z.int(),
    at: Timestamp,
    host: z.string(),
    port: z.int(),
    method: z.string(),
    binding_id: z.string().nullable().meta({ description: 'The binding whose secret was written; null for none.' }),
    status: z.int().nullable().meta({ description: 'The status the host answered; null when none came.' }),
    latency_ms: z.int().nullable(),
    refused: z.boolean(),
    reason: z.string().nullable().meta({ description: 'Why the request was refused (or failed); null otherwise.' }),
  })
  .meta({ id: 'EgressRow' });

export const EgressQuery = z.object({
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  before: z.coerce.number().int().min(1).optional().meta({ description: 'Pass `meta.next_cursor` to page backwards.' }),
});

export const EgressPage = z.object({
  data: z.array(EgressRow),
  meta: z.object({ limit: z.int(), has_more: z.boolean(), next_cursor: z.int().nullable() }),
});
