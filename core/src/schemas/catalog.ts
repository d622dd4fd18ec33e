import { z } from 'zod';

export const Catalog = z
  .object({
    runtimes: z.array(
      z.object({ id: z.string(), name: z.string(), providers: z.array(z.string()), models: z.array(z.string()) }),
    ),
    model_providers: z.array(z.string()),
    sandbox_providers: z
      .array(z.string())
      .meta({ description: 'The providers this instance offers that an agent’s `sandbox_provider` may name.' }),
    sandbox_provider_default: z
      .string()
      .meta({ description: 'The provider of agents whose `sandbox_provider` is null.' }),
    sandbox_modes: z.array(z.string()),
    package_managers: z.array(z.string()),
    avatar: z.object({ bases: z.array(z.string()), moods: z.array(z.string()) }),
    apps: z.object({
      conversations: z.string().nullable().meta({ description: 'Routes on #/c/<conversation_id>.' }),
      team: z.string().nullable().meta({ description: 'Routes on #/team/<agent_id>.' }),
    }),
  })
  .meta({ id: 'Catalog' });
