import { z } from 'zod';
import { Timestamp } from './common.ts';

/** A POSIX environment variable name. */
export const EnvKey = z
  .string()
  .max(128)
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

const AptPackage = z
  .string()
  .max(200)
  .regex(/^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~_-]+)?$/, 'must be a Debian package name, optionally =version');
const NpmPackage = z
  .string()
  .max(214)
  .regex(
    /^(@[a-z0-9~-][a-z0-9._~-]*\/)?[a-z0-9~-][a-z0-9._~-]*(@[^\s@]+)?$/,
    'must be an npm package name, optionally @version',
  );

/** `apt` and `npm` are installed and validated; other keys are stored and ignored (SPEC). */
export const Packages = z
  .object({ apt: z.array(AptPackage).max(500).optional(), npm: z.array(NpmPackage).max(500).optional() })
  .catchall(z.unknown());

const RepoUrl = z
  .string()
  .max(2000)
  .regex(
    /^(https?:\/\/[^\s/]+\/\S+|ssh:\/\/[^\s/]+\/\S+|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+)$/,
    'must be an http(s) URL or an ssh-style git address (git@host:path)',
  );
const MountPath = z
  .string()
  .min(1)
  .max(500)
  .refine((p) => !p.startsWith('/') && !p.startsWith('~'), 'must be relative')
  .refine((p) => !p.split('/').includes('..'), 'must not contain ..')
  .refine((p) => /^[A-Za-z0-9._/-]+$/.test(p), 'may hold letters, digits, . _ - and /');

export const Repository = z.object({ url: RepoUrl, mount_path: MountPath }).strict();

/**
 * A host as `networking_config.allowed_hosts` and secret bindings name it: `api.github.com`,
 * `*.example.com` (any subdomain), optionally with `:port`.
 */
export const AllowedHost = z
  .string()
  .max(253)
  .regex(
    /^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:\d{1,5})?$/,
    'must be a host name',
  );

export const NetworkingConfig = z.object({ allowed_hosts: z.array(AllowedHost).max(500) }).strict();
export const NetworkingType = z.enum(['unrestricted', 'limited']);

/** Every writable field of an environment; the service fills defaults for a create or a PUT. */
export const EnvironmentFields = z
  .object({
    name: z.string().trim().min(1).max(100),
    packages: Packages,
    env_vars: z
      .record(EnvKey, z.string().max(32_768))
      .refine((m) => Object.keys(m).length <= 200, 'at most 200 variables'),
    repositories: z.array(Repository).max(20),
    setup_script: z.string().max(100_000),
    networking_type: NetworkingType,
    networking_config: NetworkingConfig.nullable(),
  })
  .strict();

export const EnvironmentCreate = EnvironmentFields.partial().required({ name: true }).strict();
export const EnvironmentPatch = EnvironmentFields.partial().strict();

export const Environment = z
  .object({
    id: z.string(),
    name: z.string(),
    packages: z.record(z.string(), z.unknown()),
    env_vars: z.record(z.string(), z.string()),
    repositories: z.array(z.object({ url: z.string(), mount_path: z.string() })),
    setup_script: z.string(),
    networking_type: z.string(),
    networking_config: z.object({ allowed_hosts: z.array(z.string()) }).nullable(),
    secret_count: z.int(),
    agent_count: z.int(),
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'Environment' });

export const SecretUpsert = z.object({ key: EnvKey, value: z.string().min(1).max(65_536) }).strict();
export const VaultSecretUpsert = SecretUpsert.extend({
  expires_at: z.iso.datetime({ offset: true }).nullable().optional().meta({
    description: 'After this instant the secret stays listed but is not placed into new sandboxes.',
  }),
}).strict();

export const EnvironmentSecret = z
  .object({ id: z.string(), key: z.string(), created_at: Timestamp, updated_at: Timestamp })
  .meta({ id: 'EnvironmentSecret' });
