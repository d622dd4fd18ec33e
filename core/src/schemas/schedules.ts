import { z } from 'zod';
import { contentText, Timestamp } from './common.ts';

/** A schedule: a cron routine that prompts an agent. */
export const Schedule = z
  .object({
    id: z.string(),
    agent_id: z.string(),
    name: z.string(),
    cron: z.string().meta({ description: 'Five fields, or a name in the `@daily` style; evaluated in UTC.' }),
    prompt: z.string(),
    one_off: z.boolean().meta({
      description:
        "false: the prompt goes into the teammate's own conversation as a typed message. true: each run opens a fresh conversation on a new machine.",
    }),
    enabled: z.boolean(),
    next_run_at: Timestamp.nullable().meta({ description: 'The next slot in UTC; null while disabled.' }),
    last_run_at: Timestamp.nullable(),
    last_conversation_id: z.string().nullable(),
    last_error: z.string().nullable().meta({ description: 'Why the last run did not start; null when it did.' }),
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'Schedule' });

const ScheduleFields = z
  .object({
    name: z.string().trim().max(100),
    cron: z
      .string()
      .trim()
      .min(1)
      .max(200)
      .meta({ description: 'Five fields (minute hour day-of-month month day-of-week) in UTC, or `@daily` style.' }),
    prompt: contentText().min(1).max(100_000),
    one_off: z.boolean(),
    enabled: z.boolean(),
  })
  .strict();

export const ScheduleCreate = ScheduleFields.partial().required({ cron: true, prompt: true }).strict();
export const SchedulePatch = ScheduleFields.partial().strict();

export const AgentIdParam = z.object({ agent_id: z.string().min(1).max(100) });
export const ScheduleParams = z.object({ agent_id: z.string().min(1).max(100), id: z.string().min(1).max(100) });

/** The answer of run-now: the run was handed to the conversation named. */
export const ScheduleRunQueued = z.object({ status: z.literal('queued'), conversation_id: z.string() });
