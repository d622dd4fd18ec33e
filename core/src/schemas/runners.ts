import { z } from 'zod';
import { Timestamp } from './common.ts';

export const RunnerFields = z.object({ name: z.string().trim().min(1).max(100) });

/** A self-hosted runner as its owner sees it; `online` is derived from its heartbeats. */
export const Runner = z
  .object({
    id: z.string(),
    name: z.string(),
    hostname: z.string().nullable(),
    online: z.boolean(),
    path: z.string().nullable().describe('The directory its sandboxes live under (`--root`)'),
    version: z.string().nullable().describe('The runner-agent version it last connected with'),
    last_seen: Timestamp.nullable(),
    created_at: Timestamp,
  })
  .meta({ id: 'Runner' });

/** The answer to creating one: the token is shown this once and stored only as a hash. */
export const RunnerCreated = Runner.extend({
  token: z.string().describe('Shown once: pass it to svc-runner --token'),
});
