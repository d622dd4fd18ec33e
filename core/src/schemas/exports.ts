import { z } from 'zod';
import { Timestamp } from './common.ts';

/** An account export: the gzipped JSON file of the account's resources and its whole log. */
export const Export = z
  .object({
    id: z.string(),
    status: z.enum(['pending', 'ready', 'failed']).meta({
      description:
        '`pending` while the file is built in the background, `ready` once it is complete, `failed` after repeated build failures (request a new one).',
    }),
    downloadable: z.boolean().meta({ description: 'True once the file is complete (`status` `ready`).' }),
    progress: z
      .object({ events_written: z.int().meta({ description: 'Log events written to the file so far.' }) })
      .meta({ description: 'How far the build has come; the count restarts when a build is taken over.' }),
    bytes: z.int().nullable().meta({ description: 'Size of the gzipped file; null until ready.' }),
    download_url: z.string().nullable().meta({ description: 'Path of the download; null until ready.' }),
    created_at: Timestamp,
    completed_at: Timestamp.nullable(),
  })
  .meta({ id: 'Export' });
