import { z } from 'zod';
import { PRESENCE_STATES } from '../presence.ts';
import { Agent } from './agents.ts';
import { Timestamp } from './common.ts';
import { Conversation, PromptCreate, Turn } from './conversations.ts';

/** The reserved channel of the team roster's conversations. */
export const TEAM_CHANNEL = 'svc:team';

export const Presence = z
  .object({
    state: z.enum(PRESENCE_STATES),
    label: z.string().meta({ description: 'A short sentence for people, such as "Working on a turn".' }),
  })
  .meta({
    id: 'Presence',
    description:
      'First match wins: `failed` (its sandbox failed), `machine_offline` (its self-hosted runner is not connected), `starting` (its machine is being built or woken), `working` (a turn runs), `asleep` (suspended), `online` (ready), `away` (its live conversation cannot be resumed; the next message opens a fresh one), `offline` (no machine; the next message builds one).',
  });

export const Preview = z
  .object({
    kind: z.enum(['you', 'them', 'typing']),
    text: z.string(),
  })
  .meta({
    id: 'Preview',
    description:
      '`typing` while a turn runs (text empty); `them`: the start of the last reply; `you`: the start of the last prompt, which has no reply.',
  });

/** One teammate: an agent on the team with its live conversation. */
export const Teammate = z
  .object({
    agent_id: z.string(),
    name: z.string().meta({ description: "The live conversation's title: the custom name, else the agent's name." }),
    agent: Agent,
    conversation: Conversation.nullable().meta({
      description: 'The live conversation; null only when it was deleted (the next message opens a fresh one).',
    }),
    presence: Presence,
    unread: z.boolean(),
    last_turn: Turn.nullable(),
    preview: Preview.nullable().meta({ description: 'Null when there are no messages.' }),
    usage_total: z
      .object({ input: z.int(), output: z.int() })
      .meta({ description: 'Summed over every conversation the agent had on the team.' }),
    created_at: Timestamp.meta({ description: 'When the agent joined the team.' }),
  })
  .meta({ id: 'Teammate' });

const TeammateName = z
  .string()
  .max(200)
  .nullable()
  .meta({ description: "The conversation's title; null or blank keeps the agent's name." });

/** `POST /api/team`. */
export const TeammateCreate = z
  .object({
    agent_id: z.string().min(1).max(64),
    name: TeammateName.optional(),
    environment_id: z.string().min(1).max(64).optional(),
    vault_id: z.string().min(1).max(64).optional(),
  })
  .strict();

/** `POST /api/team/:agent_id/messages`: a prompt and optional images, as for a conversation. */
export const TeammateMessage = PromptCreate.strict();

/** The answer of a message: it was handed to the conversation named. */
export const TeammateMessageQueued = z.object({ status: z.literal('queued'), conversation_id: z.string() });

/** `PATCH /api/team/:agent_id`. */
export const TeammatePatch = z.object({ name: TeammateName }).strict();

/** A conversation of a teammate's team history. */
export const TeamConversation = Conversation.extend({
  current: z.boolean().meta({ description: "The teammate's live conversation." }),
}).meta({ id: 'TeamConversation' });

/** The answer of a rotation: the teammate as it is now, and its new live conversation. */
export const TeamRotation = z.object({ teammate: Teammate, conversation: Conversation });
