import { z } from 'zod';
import { Timestamp } from './common.ts';

/**
 * Sandbox statuses on the wire. SPEC lists ready, suspended, terminated and failed as the
 * values that appear; `provisioning` is shown while the first machine is still being built
 * (a launch attached to it then gets 503 `provisioning`), and becomes `ready` when the
 * runner reports the build done, or `failed` when the build fails.
 */
export const SANDBOX_STATUSES = ['provisioning', 'ready', 'suspended', 'terminated', 'failed'] as const;

export const SandboxQuery = z.object({
  status: z
    .string()
    .max(200)
    .optional()
    .meta({ description: 'Comma-separated: provisioning, ready, suspended, terminated, failed.' }),
});

export const Sandbox = z
  .object({
    id: z.string(),
    status: z.enum(SANDBOX_STATUSES),
    mode: z.enum(['ephemeral', 'persistent']),
    provider: z.enum(['runner', 'local', 'sprites', 'e2b', 'daytona']),
    url: z.string().nullable().meta({ description: 'Null unless the provider gives the machine an address.' }),
    agent_id: z.string(),
    environment_id: z.string().nullable(),
    vault_id: z.string().nullable(),
    conversations: z
      .array(
        z.object({
          id: z.string(),
          mid_turn: z.boolean().meta({ description: 'True while this conversation runs a turn.' }),
        }),
      )
      .meta({ description: 'Every conversation on the sandbox, oldest first.' }),
    runner: z
      .object({
        id: z.string(),
        name: z.string(),
        hostname: z.string().nullable(),
        online: z.boolean(),
        path: z.string().nullable().meta({ description: 'The directory its sandboxes live under (`--root`).' }),
      })
      .nullable()
      .optional()
      .meta({
        description:
          'Provider `runner` only: the self-hosted runner the sandbox lives on, with the same `online` rule as GET /api/runners; null once that runner was deleted. Absent on other providers (a `local` sandbox’s runner-agent is the instance’s own and not listed).',
      }),
    created_at: Timestamp,
  })
  .meta({ id: 'Sandbox' });
