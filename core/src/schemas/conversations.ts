import { z } from 'zod';
import { TurnError } from '../turn-errors.ts';
import { contentText, Timestamp } from './common.ts';

export const CONVERSATION_STATUSES = ['idle', 'running', 'terminated'] as const;
export const LOG_STREAMS = ['stdout', 'stderr', 'stage', 'acp'] as const;

const Usage = z.object({ input: z.int(), output: z.int() });

export const Conversation = z
  .object({
    id: z.string(),
    title: z.string(),
    status: z.enum(CONVERSATION_STATUSES),
    source: z.enum(['ui', 'agent']),
    parent_id: z.string().nullable(),
    agent_id: z.string(),
    sandbox_id: z.string().nullable(),
    channel_id: z.string().nullable(),
    turn_count: z.int(),
    last_active_at: Timestamp,
    last_read_at: Timestamp.nullable(),
    unread: z.boolean().meta({ description: 'last_active_at is later than last_read_at, or nobody ever read it.' }),
    usage_total: Usage,
    created_at: Timestamp,
  })
  .meta({ id: 'Conversation' });

export const Turn = z
  .object({
    id: z.string(),
    number: z.int(),
    prompt: z.string().meta({
      description:
        'What a person asked; on an autonomous turn a marker, `(the agent kept working after its last answer)`.',
    }),
    origin: z.enum(['user', 'autonomous']).meta({
      description:
        '`autonomous`: opened by the server for output the agent sent after answering its prompt; it ends `done` when the runtime goes quiet (AUTONOMOUS_IDLE_MS) or when a prompt arrives, which then runs after it.',
    }),
    image_count: z.int(),
    state: z.enum(['running', 'done', 'failed', 'interrupted', 'timeout']),
    usage: z
      .object({ input: z.int(), output: z.int(), cache_read: z.int().optional(), cache_write: z.int().optional() })
      .nullable()
      .meta({
        description: 'Reported once by the runtime when the turn ends; null while running or when none was reported.',
      }),
    error: TurnError.nullable().meta({
      description:
        'Why the turn failed, in words a user can act on; null unless `state` is `failed` (and on failed turns older than the field).',
    }),
    reply: z.string().nullable().meta({
      description:
        "The agent's answer for the turn: the text of its messages, joined and redacted, stored when the turn ends (at most 200,000 characters). Null while running, and when the service ended the turn without its runtime (its runner went away).",
    }),
    created_at: Timestamp,
    ended_at: Timestamp.nullable().meta({ description: 'When the turn ended; null while running.' }),
  })
  .meta({ id: 'Turn' });

export const ConversationQuery = z.object({
  roots_only: z.enum(['true', 'false']).optional(),
  agent_id: z.string().max(100).optional(),
  channel_id: z.string().max(100).optional(),
  status: z.string().max(200).optional().meta({ description: 'Comma-separated: idle, running, terminated.' }),
});

export const TreeEntry = z.object({
  id: z.string(),
  source: z.string(),
  status: z.string(),
  parent_id: z.string().nullable(),
});

export const LogEventWire = z
  .object({
    id: z.int().meta({ description: 'Usable as Last-Event-ID.' }),
    kind: z.string(),
    stream: z.string(),
    data: z.string().nullable(),
    stage: z.string().nullable(),
    state: z.string().nullable(),
    duration_ms: z.int().nullable(),
    turn_id: z.string().nullable(),
    ts: Timestamp,
    blocks: z
      .array(z.object({ kind: z.string() }).catchall(z.unknown()))
      .optional()
      .meta({
        description:
          'With ?blocks=true: the data parsed on the server (text, thinking, tool_use, tool_result, init, result, error, raw, permission_request); [] for events that are not output. A tool_use summary says what the call does (the command, the file, the pattern, the URL or the query); a later tool_use of the same id refines a call whose input was still streaming (Claude Code opens its calls with input {}).',
      }),
  })
  .meta({ id: 'LogEvent' });

export const EventsQuery = z.object({
  streams: z.string().max(100).optional().meta({ description: 'Comma-separated: stdout, stderr, stage, acp.' }),
  after: z.coerce.number().int().min(0).default(0),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  blocks: z.enum(['true', 'false']).optional(),
});

export const EventsPage = z.object({
  data: z.array(LogEventWire),
  meta: z.object({ limit: z.int(), has_more: z.boolean(), next_cursor: z.int().nullable() }),
});

/** Images per prompt, and bytes per image (decoded). */
export const PROMPT_IMAGES_MAX = 8;
export const PROMPT_IMAGE_MAX_BYTES = 5 * 1024 * 1024;

/** An image sent with a prompt: base64 bytes and their media type (png, jpeg, gif or webp). */
export const PromptImage = z.object({
  data: z.base64().max(Math.ceil(PROMPT_IMAGE_MAX_BYTES / 3) * 4),
  media_type: z.string().max(100),
});

const PromptImages = z
  .array(PromptImage)
  .max(PROMPT_IMAGES_MAX)
  .meta({
    description: `At most ${PROMPT_IMAGES_MAX} images of at most 5 MB each, image/png, image/jpeg, image/gif or image/webp (415 \`unsupported_media_type\` when the bytes are not the declared type). Served back by zero-based position.`,
  });

/** `POST /api/conversations/:id/prompts`: the next turn's words and images. */
export const PromptCreate = z.object({
  prompt: contentText().min(1).max(200_000),
  images: PromptImages.optional(),
});

export const TurnImageParams = z.object({
  id: z.string().min(1).max(64),
  turn_id: z.string().min(1).max(64),
  position: z.coerce.number().int().min(0),
});

/** `POST /api/conversations`: the agent, and optionally what to run it with and the first prompt. */
export const ConversationCreate = z.object({
  agent_id: z.string().min(1).max(64),
  prompt: contentText().min(1).max(200_000).optional(),
  images: PromptImages.optional(),
  environment_id: z.string().min(1).max(64).optional(),
  vault_id: z.string().min(1).max(64).optional(),
  sandbox_id: z.string().min(1).max(64).optional().meta({
    description:
      'Attach to this sandbox (ready or suspended, built for the same agent, environment and vault); nothing is provisioned.',
  }),
  sandbox_mode: z.enum(['ephemeral', 'persistent']).optional(),
});
