import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { ApiError, TEAM_CHANNEL } from '@svc/core';
import { conversations, type Sql } from '@svc/db';
import { z } from 'zod';
import type { ActorRef, Principal } from './principal.ts';
import type { TurnWaiters } from './turn-waiters.ts';

/*
 * The team MCP server `svc-team` (SPEC Team rule 7): what a teammate's runtime calls to know
 * its teammates, message one, wait for its reply and read its thread. The tools act for the
 * conversation whose sandbox token called, as that teammate; they never reach beyond the
 * caller's own team. Transport-free: the route hands the McpServer a transport.
 */

/** The server's name in a runtime's MCP configuration. */
export const TEAM_MCP_SERVER = 'svc-team';

/** The longest `wait_for_teammate` holds a call (SPEC Limits). */
export const TEAM_WAIT_MAX_S = 90;

/** A roster entry, as much of it as the tools read (services/team.ts gives wider ones). */
export interface Teammate {
  name: string;
  agent: { id: string; name: string; description?: string | null };
  /** The live conversation; null when none is open (the next message opens one). */
  conversation: { id: string; status: string } | null;
  presence: { state: string; label: string };
}

/**
 * The team's operations the tools stand on (services/team.ts). `messageTeammate` opens a turn in the
 * teammate's thread and throws ApiError `conversation_busy`, `provisioning`,
 * `runner_offline` or `not_found` when it cannot.
 */
export interface TeamOps {
  listTeammates(who: ActorRef): Promise<Teammate[]>;
  messageTeammate(
    who: ActorRef,
    agentId: string,
    message: { prompt: string },
  ): Promise<{ conversationId: string; turn: conversations.TurnRow }>;
}

export interface TeamMcpDeps {
  sql: Sql;
  team: TeamOps;
  waiters: TurnWaiters;
  /** How long `wait_for_teammate` holds a call (TEAM_WAIT_MS; at most TEAM_WAIT_MAX_S). */
  waitMs: number;
}

/**
 * Who may call the team server of `conversationId`: only that conversation's own sandbox
 * token (403 `forbidden` for a person's key or session; 404 for another conversation's token,
 * so ids cannot be probed), and only while the conversation is on the team channel (404).
 */
export async function checkTeamCaller(sql: Sql, who: Principal, conversationId: string): Promise<void> {
  if (who.actor !== 'sprite') {
    throw new ApiError('forbidden', 'Only the sandbox token of this conversation may call its team MCP server.');
  }
  const notFound = new ApiError('not_found', 'Conversation not found.');
  if (who.conversationId !== conversationId) throw notFound;
  const conv = await conversations.getConversation(sql, who.accountId, conversationId);
  if (!conv || conv.channel_id !== TEAM_CHANNEL) throw notFound;
}

/** How many turns `read_teammate` returns by default, and at most. */
const READ_DEFAULT = 10;
const READ_MAX = 50;
/** How much of one prompt or reply `read_teammate` quotes. */
const QUOTE_MAX_CHARS = 8000;

/** The note a message to a teammate ends with: who alone can send one. */
export const TEAM_MESSAGE_NOTE =
  '(Only your owner and your teammates can send you a message like this one. Your answer here is what they read back.)';

/** The prompt that lands in the target's thread: the sender named in front, the note at the end. */
export function teammateMessage(sender: string, message: string): string {
  return `Message from ${sender}, your teammate: ${message}\n\n${TEAM_MESSAGE_NOTE}`;
}

const json = (value: unknown): CallToolResult => ({
  content: [{ type: 'text', text: JSON.stringify(value, null, 2) }],
  structuredContent: value as Record<string, unknown>,
});

/** A tool error: the runtime's model reads `message` and may act on it (SPEC: not an exception). */
const toolError = (message: string): CallToolResult => ({ content: [{ type: 'text', text: message }], isError: true });

/** Raised inside a tool for an answer that is a tool error. */
class ToolRefusal extends Error {}

function summary(t: Teammate) {
  return {
    name: t.name,
    agent_id: t.agent.id,
    agent_name: t.agent.name,
    role: t.agent.description ?? '',
    presence: t.presence,
    conversation_id: t.conversation?.id ?? null,
  };
}

function shapeTurn(turn: conversations.TurnRow) {
  const quote = (s: string | null) =>
    s !== null && s.length > QUOTE_MAX_CHARS ? `${s.slice(0, QUOTE_MAX_CHARS)}… (cut)` : s;
  return {
    turn_id: turn.id,
    conversation_id: turn.conversation_id,
    origin: turn.origin,
    state: turn.state,
    prompt: quote(turn.prompt),
    reply: turn.state === 'running' ? null : quote(turn.reply),
    error: turn.state === 'failed' ? turn.error : null,
    created_at: turn.created_at.toISOString(),
    ended_at: turn.ended_at?.toISOString() ?? null,
  };
}

/** Why a message could not be delivered, in words a model can act on. */
function undeliverable(name: string, err: ApiError): string {
  switch (err.code) {
    case 'conversation_busy':
      return `${name} is busy: a turn is still running in their thread. Call wait_for_teammate, then send again.`;
    case 'provisioning':
      return `${name} is still starting: their machine is being built. Try again in a little while.`;
    case 'runner_offline':
    case 'no_runner_online':
      return `${name}'s machine is offline: the message cannot be delivered until it is back.`;
    default:
      return `${name} cannot take a message now: ${err.message}`;
  }
}

/**
 * The `svc-team` server for one call of the conversation `conversationId` (a teammate's live
 * conversation), acting as `who` (that conversation's sandbox token). A fresh server per
 * request: the transport is stateless, and nothing lives between calls but the waiters.
 */
export function teamMcpServer(deps: TeamMcpDeps, who: ActorRef, conversationId: string): McpServer {
  const server = new McpServer(
    { name: TEAM_MCP_SERVER, version: '1.0.0' },
    {
      instructions:
        'Your teammates: other agents on the same team, each with its own machine and thread. Find them with list_teammates or get_teammate, message one with send_to_teammate, then wait_for_teammate for the reply; read_teammate shows their recent prompts and replies.',
    },
  );

  /** The roster split into the caller and the others. */
  const roster = async () => {
    const all = await deps.team.listTeammates(who);
    const me = all.find((t) => t.conversation?.id === conversationId);
    return { me, others: all.filter((t) => t !== me) };
  };

  /** The teammate `key` names: an agent id, or a name (the teammate's or its agent's), any case. */
  const target = async (key: string) => {
    const { me, others } = await roster();
    const k = key.trim().toLowerCase();
    const named = (t: Teammate) => t.agent.id === key.trim() || t.name.toLowerCase() === k;
    if (me && (named(me) || me.agent.name.toLowerCase() === k)) {
      throw new ToolRefusal(`${me.name} is you: pick another teammate (list_teammates names them).`);
    }
    const found = others.find(named) ?? others.find((t) => t.agent.name.toLowerCase() === k);
    if (!found) {
      throw new ToolRefusal(
        `No teammate is named "${key}". Teammates: ${others.map((t) => t.name).join(', ') || '(none)'}.`,
      );
    }
    return { me, found };
  };

  /** Runs a tool body; a ToolRefusal is answered as a tool error, anything else is the server's failure. */
  const tool =
    <A>(body: (args: A) => Promise<CallToolResult>) =>
    async (args: A): Promise<CallToolResult> => {
      try {
        return await body(args);
      } catch (err) {
        if (err instanceof ToolRefusal) return toolError(err.message);
        throw err;
      }
    };

  const teammateArg = z
    .string()
    .min(1)
    .max(200)
    .describe("The teammate: their name (as list_teammates gives it, any case) or their agent's id.");

  server.registerTool(
    'list_teammates',
    {
      title: 'List teammates',
      description:
        'Lists your teammates (everyone on the team but you): name, agent id, role (the agent’s description) and presence (working, online, asleep, starting, machine_offline, ...).',
      inputSchema: {},
      annotations: { readOnlyHint: true },
    },
    tool(async () => json({ teammates: (await roster()).others.map(summary) })),
  );

  server.registerTool(
    'get_teammate',
    {
      title: 'Find a teammate',
      description:
        'Finds teammates by name, role or keyword (case-insensitive; matched against their name, their agent’s name and id, and their role). Exact name matches come first. No match is an error naming who is on the team.',
      inputSchema: { query: z.string().min(1).max(200).describe('A name, a role or a keyword, e.g. "reviewer".') },
      annotations: { readOnlyHint: true },
    },
    tool(async ({ query }: { query: string }) => {
      const { others } = await roster();
      const q = query.trim().toLowerCase();
      const fields = (t: Teammate) => [t.name, t.agent.name, t.agent.id, t.agent.description ?? ''];
      const exact = others.filter((t) => fields(t).some((f) => f.toLowerCase() === q));
      const partial = others.filter((t) => !exact.includes(t) && fields(t).some((f) => f.toLowerCase().includes(q)));
      const matches = [...exact, ...partial];
      if (matches.length === 0) {
        throw new ToolRefusal(
          `No teammate matches "${query}". Teammates: ${others.map((t) => t.name).join(', ') || '(none)'}.`,
        );
      }
      return json({ teammates: matches.map(summary) });
    }),
  );

  server.registerTool(
    'send_to_teammate',
    {
      title: 'Message a teammate',
      description:
        'Sends a message into a teammate’s thread, as a new turn they start working on at once (it reaches them prefixed with your name). Returns the turn it created; pass its turn_id to wait_for_teammate for the reply. A teammate who is busy (a turn running), still starting, or whose machine is offline cannot take it: the error says which.',
      inputSchema: {
        teammate: teammateArg,
        message: z.string().min(1).max(100_000).describe('What to tell or ask them.'),
      },
    },
    tool(async ({ teammate, message }: { teammate: string; message: string }) => {
      const { me, found } = await target(teammate);
      const sender = me?.name ?? (await conversations.getConversation(deps.sql, who.accountId, conversationId))?.title;
      try {
        const sent = await deps.team.messageTeammate(who, found.agent.id, {
          prompt: teammateMessage(sender || 'a teammate', message),
        });
        return json({
          teammate: found.name,
          agent_id: found.agent.id,
          conversation_id: sent.conversationId,
          turn_id: sent.turn.id,
          state: sent.turn.state,
        });
      } catch (err) {
        if (err instanceof ApiError) throw new ToolRefusal(undeliverable(found.name, err));
        throw err;
      }
    }),
  );

  server.registerTool(
    'wait_for_teammate',
    {
      title: 'Wait for a teammate’s reply',
      description: `Blocks until the teammate's turn ends, for up to ${TEAM_WAIT_MAX_S} seconds, and returns that turn: its state (done, failed, interrupted, timeout) and reply. Without since_turn it waits for the turn running in their thread (or returns their last turn when none runs). timed_out: true means the turn is still running: call again.`,
      inputSchema: {
        teammate: teammateArg,
        since_turn: z
          .string()
          .min(1)
          .max(64)
          .optional()
          .describe('Wait for this turn (the turn_id send_to_teammate returned) rather than their current one.'),
      },
      annotations: { readOnlyHint: true },
    },
    tool(async ({ teammate, since_turn }: { teammate: string; since_turn?: string }) => {
      const { found } = await target(teammate);
      const live = found.conversation?.id;
      let turn: conversations.TurnRow | undefined;
      if (since_turn) {
        // Any turn of the teammate's threads: a message may have opened a fresh conversation.
        turn = await conversations.getTurn(deps.sql, who.accountId, since_turn);
        const of = turn && (await conversations.getConversation(deps.sql, who.accountId, turn.conversation_id));
        if (!turn || of?.agent_id !== found.agent.id) {
          throw new ToolRefusal(`Turn ${since_turn} is not a turn of ${found.name}.`);
        }
      } else if (live) {
        turn =
          (await conversations.runningTurn(deps.sql, who.accountId, live)) ??
          (await conversations.listTurns(deps.sql, who.accountId, live)).at(-1);
      }
      if (!turn) throw new ToolRefusal(`${found.name} has no turns yet: send_to_teammate first.`);
      const waited =
        turn.state === 'running'
          ? await deps.waiters.wait(who.accountId, turn.id, Math.min(deps.waitMs, TEAM_WAIT_MAX_S * 1000))
          : { turn, timedOut: false };
      const now = waited.turn ?? turn;
      return json({ teammate: found.name, timed_out: waited.timedOut, ...shapeTurn(now) });
    }),
  );

  server.registerTool(
    'read_teammate',
    {
      title: 'Read a teammate’s thread',
      description:
        'Returns the recent prompts and replies of a teammate’s current thread, newest last (a running turn has reply null).',
      inputSchema: {
        teammate: teammateArg,
        limit: z
          .number()
          .int()
          .min(1)
          .max(READ_MAX)
          .optional()
          .describe(`How many of the latest turns (default ${READ_DEFAULT}, at most ${READ_MAX}).`),
      },
      annotations: { readOnlyHint: true },
    },
    tool(async ({ teammate, limit }: { teammate: string; limit?: number }) => {
      const { found } = await target(teammate);
      const live = found.conversation?.id ?? null;
      const turns = live ? await conversations.listTurns(deps.sql, who.accountId, live) : [];
      return json({
        teammate: found.name,
        conversation_id: live,
        turns: turns.slice(-(limit ?? READ_DEFAULT)).map(shapeTurn),
      });
    }),
  );

  return server;
}
