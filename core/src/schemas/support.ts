import { z } from 'zod';
import { contentText, Timestamp } from './common.ts';

export const SUPPORT_CATEGORIES = ['bug', 'stuck', 'question', 'idea', 'other'] as const;

/** SPEC Limits: message 20 KB (UTF-8 bytes), context 64 KB (as JSON), screenshot 5 MB (decoded). */
export const SUPPORT_MESSAGE_MAX_BYTES = 20 * 1024;
export const SUPPORT_CONTEXT_MAX_BYTES = 64 * 1024;
export const SUPPORT_SCREENSHOT_MAX_BYTES = 5 * 1024 * 1024;
/** Nesting of `context` (objects and arrays in one another); what a client knows is shallow. */
export const SUPPORT_CONTEXT_MAX_DEPTH = 32;

/** How deep objects and arrays nest in `value` (a scalar is 0), found without recursion. */
function depthOf(value: unknown): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length) {
    const [v, depth] = stack.pop() as [unknown, number];
    if (v === null || typeof v !== 'object') continue;
    deepest = Math.max(deepest, depth + 1);
    for (const child of Object.values(v)) stack.push([child, depth + 1]);
  }
  return deepest;
}

const LIMITS = `\`message\` at most ${SUPPORT_MESSAGE_MAX_BYTES} bytes of UTF-8, \`context\` at most ${SUPPORT_CONTEXT_MAX_BYTES} bytes as JSON, \`screenshot\` at most ${SUPPORT_SCREENSHOT_MAX_BYTES} bytes once decoded: larger is 413 \`payload_too_large\` naming the field.`;

/** `POST /api/support/reports`. */
export const SupportReportCreate = z
  .object({
    category: z.enum(SUPPORT_CATEGORIES),
    message: contentText()
      .min(1)
      .meta({ description: `What happened, in the reporter's words; at most ${SUPPORT_MESSAGE_MAX_BYTES} bytes.` }),
    context: z
      .record(z.string(), z.unknown())
      .refine((v) => depthOf(v) <= SUPPORT_CONTEXT_MAX_DEPTH, {
        message: `nests objects and arrays deeper than ${SUPPORT_CONTEXT_MAX_DEPTH} levels`,
      })
      .optional()
      .meta({
        description: `What the client knew (conversation, agent, sandbox, presence, recent events, app version, page URL), at most ${SUPPORT_CONTEXT_MAX_BYTES} bytes as JSON, nested at most ${SUPPORT_CONTEXT_MAX_DEPTH} levels (422 beyond). Never a secret: values under keys that name one (password, token, secret, api key, authorization, cookie, credential) and values that are the account's own secrets or the service's credentials are stored as \`[REDACTED]\`.`,
      }),
    client: z.string().trim().max(200).optional().meta({ description: 'The client, a name and a version.' }),
    screenshot: z
      .object({
        data: z.base64(),
        media_type: z.string().max(100),
      })
      .strict()
      .optional()
      .meta({
        description: `base64 bytes of a png, jpeg, gif or webp image, judged by the bytes: a type the bytes do not show is 415 \`unsupported_media_type\`.`,
      }),
  })
  .strict()
  .meta({ description: LIMITS });

export const SupportReport = z
  .object({
    id: z.string(),
    category: z.enum(SUPPORT_CATEGORIES),
    status: z.enum(['new', 'forwarded', 'failed']).meta({
      description:
        '`new` until forwarding ends (also when the instance forwards nowhere: the stored reports are then the inbox), then `forwarded` or `failed`.',
    }),
    message: z.string(),
    context: z.record(z.string(), z.unknown()).nullable(),
    client: z.string().nullable(),
    screenshot: z
      .object({ media_type: z.string(), bytes: z.int() })
      .nullable()
      .meta({ description: 'That a screenshot exists, its type and size; the image itself is never served back.' }),
    forwarded_at: Timestamp.nullable(),
    external_url: z.string().nullable().meta({ description: 'The issue opened for the report, when one was.' }),
    forward_error: z.string().nullable().meta({
      description:
        'Why the last forwarding attempt failed; with status `new` another attempt is still due, with `failed` none is.',
    }),
    created_at: Timestamp,
  })
  .meta({ id: 'SupportReport' });
