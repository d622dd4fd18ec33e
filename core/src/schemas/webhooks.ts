import { z } from 'zod';
import { DEFAULT_WEBHOOK_EVENT_TYPES } from '../webhooks.ts';
import { Timestamp } from './common.ts';

const EventTypes = z.array(z.string().min(1).max(100)).min(1).max(100).meta({
  description:
    'Each entry is an exact type (`conversation.turn.done`), one stage (`conversation.turn.*`) or everything (`*`). A mistyped exact type is 422 `validation_failed` naming it under `details.event_types`.',
});

/** A webhook endpoint as listed; its secret never appears here. */
export const WebhookEndpoint = z
  .object({
    id: z.string(),
    url: z.string(),
    description: z.string(),
    event_types: z.array(z.string()),
    status: z.enum(['active', 'disabled']),
    disabled_reason: z
      .string()
      .nullable()
      .meta({ description: 'Why the endpoint was disabled (null while active). Resume it to deliver again.' }),
    disabled_at: Timestamp.nullable(),
    created_at: Timestamp,
    updated_at: Timestamp,
  })
  .meta({ id: 'WebhookEndpoint' });

/** The answer of create and rotate-secret: the only places the secret is shown. */
export const WebhookEndpointWithSecret = WebhookEndpoint.extend({
  secret: z.string().meta({
    description:
      'The signing secret (`whsec_...`), shown on create and rotate only. Verify `Svc-Signature: t=<unix>,v1=<hex>`: HMAC-SHA256 of `<t>.<raw body>` under this secret.',
  }),
}).meta({ id: 'WebhookEndpointWithSecret' });

const Url = z.string().min(1).max(2000).meta({
  description:
    '`https://` (plain `http://` only when the instance sets WEBHOOK_ALLOW_HTTP); no credentials in the URL. Every delivery resolves the host and refuses addresses that are not publicly routable.',
});
const Description = z.string().max(500);

export const WebhookEndpointCreate = z
  .object({
    url: Url,
    event_types: EventTypes.optional().meta({
      description: `Absent: ${DEFAULT_WEBHOOK_EVENT_TYPES.join(', ')}.`,
    }),
    description: Description.optional(),
  })
  .strict()
  .meta({ example: { url: 'https://hooks.example.com/svc', event_types: ['conversation.turn.*'] } });

export const WebhookEndpointPatch = z
  .object({
    url: Url,
    description: Description,
    event_types: EventTypes,
    status: z.enum(['active', 'disabled']).meta({
      description:
        '`disabled` stops delivery; `active` resumes a disabled endpoint (as POST /resume does) and resets its failure count.',
    }),
  })
  .partial()
  .strict();

/** One delivery attempt, as listed. */
export const WebhookDelivery = z
  .object({
    id: z.string(),
    event: z.string().meta({ description: "The event's id (the log event id; `test_...` for webhook.test)." }),
    type: z.string(),
    try: z.int().meta({ description: 'The attempt number of this event on this endpoint, from 1.' }),
    result: z.int().nullable().meta({ description: 'The HTTP status the receiver answered; null when none came.' }),
    took: z.int().meta({ description: 'Milliseconds from sending to the end of the answer (or the failure).' }),
    detail: z.string().meta({
      description:
        'The first 4 KB of the response body, or why no answer came (a refused address, a timeout, a TLS error).',
    }),
    created_at: Timestamp,
  })
  .meta({ id: 'WebhookDelivery' });

export const WebhookDeliveryQuery = z.object({
  limit: z.coerce.number().int().min(1).max(200).default(50),
  before: z.string().max(100).optional().meta({ description: 'Pass `meta.next_cursor` to page backwards.' }),
});

export const WebhookDeliveryPage = z.object({
  data: z.array(WebhookDelivery),
  meta: z.object({ limit: z.int(), has_more: z.boolean(), next_cursor: z.string().nullable() }),
});

export const WebhookDeliveryParams = z.object({
  id: z.string().min(1).max(100),
  delivery_id: z.string().min(1).max(100),
});

/** What test and redeliver answer: the event queued for the endpoint. */
export const WebhookQueued = z.object({
  status: z.literal('queued'),
  event: z.string(),
  type: z.string(),
});

/** The body of every delivery (SPEC Webhook events). Never content: no prompt, output or secret. */
export const WebhookPayload = z.object({
  id: z.string(),
  type: z.string(),
  /** UTC to the microsecond (six fractional digits): when the log appended the event. */
  created_at: z.iso.datetime({ offset: false, precision: 6 }),
  data: z.object({
    conversation_id: z.string().nullable(),
    agent_id: z.string().nullable(),
    parent_conversation_id: z.string().nullable(),
    status: z.string().nullable(),
    stage: z.string().nullable(),
    state: z.string().nullable(),
    turn_id: z.string().nullable(),
    duration_ms: z.number().nullable(),
  }),
});
