import { z } from 'zod';
import { PERMISSION_RESOLUTIONS } from '../runner-protocol.ts';
import { Timestamp } from './common.ts';

/** `POST /api/conversations/:id/requests/:request_id`: one of the offered `optionId` values. */
export const PermissionAnswerBody = z.object({ option_id: z.string().min(1).max(200) }).strict();

export const PermissionRequestParams = z.object({
  id: z.string().min(1).max(100),
  request_id: z.string().min(1).max(100),
});

/** A permission request as recorded: pending until the first answer, a timeout or its turn's end. */
export const PermissionRequest = z
  .object({
    id: z.string().meta({ description: 'The request id of the `permission_request` block.' }),
    conversation_id: z.string(),
    turn_id: z.string().nullable(),
    status: z.enum(['pending', 'resolved']),
    resolution: z.enum(PERMISSION_RESOLUTIONS).nullable().meta({
      description:
        'How it was resolved: `answered` over the API; `timeout` after PERMISSION_TIMEOUT_S, `turn_end` or `interrupted` deny it. Null while pending.',
    }),
    option_id: z.string().nullable().meta({
      description: 'The option the runtime got (a reject option when denied); null while pending or cancelled.',
    }),
    options: z.array(z.object({ optionId: z.string(), name: z.string(), kind: z.string() })),
    created_at: Timestamp,
    resolved_at: Timestamp.nullable(),
  })
  .meta({ id: 'PermissionRequest' });
