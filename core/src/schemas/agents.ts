import { z } from 'zod';
import { AVATAR_BASES, AVATAR_MOODS, RUNTIMES, SANDBOX_MODES, SANDBOX_PROVIDERS } from '../catalog.ts';
import { Timestamp } from './common.ts';

/**
 * A skill is exactly one of `{source, ref?}` (installed from a code host) or `{name, content}`
 * (written into the sandbox verbatim).
 */
export const Skill = z
  .object({
    source: z.string().min(1).max(500).optional(),
    ref: z.string().min(1).max(200).optional(),
    name: z
      .string()
      .regex(/^[a-z0-9][a-z0-9-]{0,63}$/, 'must be lower-case letters, digits and -')
      .optional(),
    content: z.string().min(1).max(200_000).optional(),
  })
  .strict()
  .superRefine((s, ctx) => {
    const fromHost = s.source !== undefined;
    const inline = s.name !== undefined || s.content !== undefined;
    if (fromHost === inline || (inline && (s.name === undefined || s.content === undefined)) || (s.ref && !fromHost)) {
      ctx.addIssue({ code: 'custom', message: 'must be exactly one of {source, ref?} or {name, content}' });
    }
  });

export const McpServer = z
  .object({ command: z.string().min(1).max(1000), args: z.array(z.string().max(4000)).max(100).default([]) })
  .strict();

const McpName = z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'must be 1-64 letters, digits, _ or -');

/** DECISIONS: `{default: auto_allow | ask, ask: [tool kind or exact tool name]}`; unknown keys are 422. */
export const PermissionPolicy = z
  .object({
    default: z.enum(['auto_allow', 'ask']).default('auto_allow'),
    ask: z.array(z.string().min(1).max(200)).max(100).default([]),
  })
  .strict()
  .meta({ id: 'PermissionPolicy' });

const Model = z
  .string()
  .min(3)
  .max(200)
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*\/\S+$/, 'must be provider/model_id');
const IdList = z.array(z.string().min(1).max(100)).max(200).nullable();

/** Every writable field of an agent; the service fills defaults for a create or a PUT. */
export const AgentFields = z
  .object({
    name: z.string().trim().min(1).max(100),
    description: z.string().max(2000),
    system: z.string().max(100_000),
    runtime: z.enum(RUNTIMES),
    model: Model,
    environment_id: z.string().min(1).max(100),
    skills: z.array(Skill).max(50),
    mcp_servers: z.record(McpName, McpServer).refine((m) => Object.keys(m).length <= 50, 'at most 50 servers'),
    sandbox_provider: z.enum(SANDBOX_PROVIDERS).nullable(),
    sandbox_mode: z.enum(SANDBOX_MODES),
    allowed_vault_ids: IdList.meta({ description: 'null permits every vault, [] none, a list is an allowlist.' }),
    allowed_environment_ids: IdList.meta({ description: 'Same semantics, for launching under another environment.' }),
    permission_policy: PermissionPolicy,
  })
  .strict();

export const AgentCreate = AgentFields.partial()
  .required({ name: true, runtime: true, model: true, environment_id: true })
  .strict();
export const AgentPatch = AgentFields.partial().strict();

export const Agent = z
  .object({
    id: z.string(),
    name: z.string(),
    description: z.string(),
    system: z.string(),
    runtime: z.enum(RUNTIMES),
    model: z.string(),
    environment_id: z.string(),
    skills: z.array(
      z.union([
        z.object({ source: z.string(), ref: z.string().optional() }),
        z.object({ name: z.string(), content: z.string() }),
      ]),
    ),
    mcp_servers: z.record(z.string(), z.object({ command: z.string(), args: z.array(z.string()) })),
    sandbox_provider: z.enum(SANDBOX_PROVIDERS).nullable(),
    sandbox_mode: z.enum(SANDBOX_MODES),
    allowed_vault_ids: z.array(z.string()).nullable(),
    allowed_environment_ids: z.array(z.string()).nullable(),
    permission_policy: z.object({ default: z.enum(['auto_allow', 'ask']), ask: z.array(z.string()) }),
    avatar_media_type: z.string().nullable(),
    conversation_count: z.int(),
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'Agent' });

export const AgentQuery = z.object({
  search: z.string().max(200).optional(),
  runtime: z.enum(RUNTIMES).optional(),
  environment_id: z.string().max(100).optional(),
  has_skills: z.enum(['true', 'false']).optional(),
  has_mcp: z.enum(['true', 'false']).optional(),
});

export const AVATAR_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'] as const;
export const AVATAR_MAX_BYTES = 5 * 1024 * 1024;

export const AvatarJson = z.object({ data: z.string().max(8_000_000), media_type: z.string().max(100) }).strict();

export const AvatarGenerate = z.object({ base: z.enum(AVATAR_BASES), mood: z.enum(AVATAR_MOODS) }).strict();
export const AvatarImage = z.object({ data: z.string(), media_type: z.literal('image/png') });

/** The media type the bytes' signature shows, or undefined when it is none of the four allowed. */
export function sniffImage(bytes: Uint8Array): (typeof AVATAR_TYPES)[number] | undefined {
  const b = bytes;
  if (
    b.length >= 8 &&
    b[0] === 0x89 &&
    b[1] === 0x50 &&
    b[2] === 0x4e &&
    b[3] === 0x47 &&
    b[4] === 0x0d &&
    b[5] === 0x0a &&
    b[6] === 0x1a &&
    b[7] === 0x0a
  ) {
    return 'image/png';
  }
  if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return 'image/jpeg';
  const ascii = (from: number, to: number) => String.fromCharCode(...b.subarray(from, to));
  if (b.length >= 6 && (ascii(0, 6) === 'GIF87a' || ascii(0, 6) === 'GIF89a')) return 'image/gif';
  if (b.length >= 12 && ascii(0, 4) === 'RIFF' && ascii(8, 12) === 'WEBP') return 'image/webp';
  return undefined;
}
