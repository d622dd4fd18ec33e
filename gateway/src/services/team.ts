import { ApiError, orNotFound, presenceOf, TEAM_CHANNEL, type Teammate, type TeammateCreate } from '@svc/core';
import { agents, conversations, outbox, type Sql, teammates } from '@svc/db';
import type { z } from 'zod';
import { shapeAgent } from './agents.ts';
import { recordAudit } from './audit.ts';
import { shapeConversation, shapeTurn } from './conversations.ts';
import { type LaunchDeps, sendPrompt, startConversation } from './launch.ts';
import type { ActorRef } from './principal.ts';
import { runnerOnline } from './runners.ts';
import { changed } from './tenant-events.ts';

/*
 * The team: agents bound to the reserved channel `svc:team`, each with one lasting sandbox
 * (its persistent machine) and one live conversation at a time. Every change to the roster
 * writes the tenant's `team` change event in the transaction of the change.
 */

export interface TeamDeps {
  launch: LaunchDeps;
  /** A runner not heard from for this long is offline (RUNNER_GRACE_MS, as GET /api/runners). */
  runnerOfflineAfterMs: number;
}

export type TeammateEntry = z.infer<typeof Teammate>;

/** A preview's text is the start of a prompt or a reply. */
const PREVIEW_CHARS = 280;

/** A custom name as stored: trimmed; blank or null keeps the agent's name (null). */
function customName(name: string | null | undefined): string | null {
  const trimmed = name?.trim() ?? '';
  return trimmed === '' ? null : trimmed;
}

const notOnTeam = (agentId: string) => new ApiError('not_found', `Agent ${agentId} is not on the team.`);

async function teammateRow(sql: Sql, accountId: string, agentId: string) {
  const row = await teammates.getTeammate(sql, accountId, agentId);
  if (!row) throw notOnTeam(agentId);
  return row;
}

/**
 * Roster entries for the given rows, with a fixed number of queries whatever their count:
 * their agents, live conversations, those conversations' sandboxes with their runners'
 * presence, last turns, and the usage of every team conversation.
 */
async function entries(deps: TeamDeps, accountId: string, rows: teammates.TeammateRow[]): Promise<TeammateEntry[]> {
  if (rows.length === 0) return [];
  const { sql, providers } = deps.launch;
  const agentRows =
    rows.length === 1
      ? [await agents.getAgent(sql, accountId, (rows[0] as teammates.TeammateRow).agent_id)]
      : await agents.listAgents(sql, accountId);
  const agentById = new Map(agentRows.filter((a) => a !== undefined).map((a) => [a.id, a]));
  const conversationIds = rows.map((r) => r.conversation_id).filter((id) => id !== null);
  const convById = new Map(
    (await conversations.conversationsByIds(sql, accountId, conversationIds)).map((c) => [c.id, c]),
  );
  const sandboxIds = [...convById.values()].map((c) => c.sandbox_id).filter((id) => id !== null);
  const sandboxById = new Map((await teammates.sandboxSignals(sql, accountId, sandboxIds)).map((s) => [s.id, s]));
  const lastById = new Map(
    (await teammates.lastTurns(sql, accountId, conversationIds)).map((t) => [t.conversation_id, t]),
  );
  const usageByAgent = new Map((await teammates.teamUsage(sql, accountId)).map((u) => [u.agent_id, u]));
  const now = Date.now();

  const out: TeammateEntry[] = [];
  for (const row of rows) {
    const agent = agentById.get(row.agent_id);
    if (!agent) continue; // deleted meanwhile: its row goes with it
    const conv = row.conversation_id ? convById.get(row.conversation_id) : undefined;
    const sandbox = conv?.sandbox_id ? sandboxById.get(conv.sandbox_id) : undefined;
    const last = conv ? lastById.get(conv.id) : undefined;
    const usage = usageByAgent.get(row.agent_id);
    const presence = presenceOf({
      sandbox: sandbox?.status ?? null,
      runnerBacked: sandbox ? providers.of(sandbox.provider).showsRunner : false,
      runnerOnline: runnerOnline(
        sandbox?.runner_connected ?? false,
        sandbox?.runner_last_seen_at ?? null,
        deps.runnerOfflineAfterMs,
        now,
      ),
      runnerLastSeenAt: sandbox?.runner_last_seen_at ?? null,
      turnRunning: conv?.status === 'running',
      resumable: conv !== undefined && conv.status !== 'terminated',
    });
    const shapedConv = conv ? shapeConversation(conv) : null;
    out.push({
      agent_id: row.agent_id,
      name: conv?.title ?? row.name ?? agent.name,
      agent: shapeAgent(agent),
      conversation: shapedConv,
      presence,
      unread: shapedConv?.unread ?? false,
      last_turn: last ? shapeTurn(last) : null,
      preview: previewOf(last),
      usage_total: { input: Number(usage?.input ?? 0), output: Number(usage?.output ?? 0) },
      created_at: row.created_at.toISOString(),
    });
  }
  return out;
}

/** typing while the last turn runs; them: its reply; you: its prompt when it has no reply. */
function previewOf(last: conversations.TurnRow | undefined): TeammateEntry['preview'] {
  if (!last) return null;
  if (last.state === 'running') return { kind: 'typing', text: '' };
  if (last.reply) return { kind: 'them', text: last.reply.slice(0, PREVIEW_CHARS) };
  return { kind: 'you', text: last.prompt.slice(0, PREVIEW_CHARS) };
}

/** `GET /api/team`: every teammate of the caller, in the order they joined. */
export async function listTeammates(deps: TeamDeps, who: ActorRef): Promise<TeammateEntry[]> {
  return entries(deps, who.accountId, await teammates.listTeammates(deps.launch.sql, who.accountId));
}

/** `GET /api/team/:agent_id`: one teammate; 404 when the agent is not on the caller's team. */
export async function getTeammate(deps: TeamDeps, who: ActorRef, agentId: string): Promise<TeammateEntry> {
  const row = await teammateRow(deps.launch.sql, who.accountId, agentId);
  const [entry] = await entries(deps, who.accountId, [row]);
  if (!entry) throw notOnTeam(agentId);
  return entry;
}

/** Thrown inside the add's transaction when another request put the agent on the team first. */
class AlreadyOnTeam extends Error {}

/**
 * `POST /api/team`: the first time, opens the agent's live conversation on the team channel
 * (titled with `name`, else the agent's name) on the agent's one lasting sandbox for that
 * environment and vault (a persistent launch without a prompt: its machine is built now), and
 * records the teammate with its `team` event in the launch's transaction: `created: true`.
 * An agent already on the team answers its live conversation as it is, the attributes ignored:
 * `created: false`. The launch's checks apply (404 for an unknown agent, environment or vault,
 * 422 for one the agent's allowlists do not permit, 422 `missing_credential`, 503
 * `provisioning` while that machine is being built for another conversation).
 */
export async function addTeammate(
  deps: TeamDeps,
  who: ActorRef,
  input: z.infer<typeof TeammateCreate>,
): Promise<{ created: boolean; teammate: TeammateEntry }> {
  const { sql } = deps.launch;
  const agent = orNotFound(await agents.getAgent(sql, who.accountId, input.agent_id), 'Agent');
  const existing = async () => ({ created: false, teammate: await getTeammate(deps, who, agent.id) });
  if (await teammates.getTeammate(sql, who.accountId, agent.id)) return existing();
  const name = customName(input.name);
  try {
    await startConversation(
      deps.launch,
      who,
      {
        agent_id: agent.id,
        ...(input.environment_id ? { environment_id: input.environment_id } : {}),
        ...(input.vault_id ? { vault_id: input.vault_id } : {}),
        sandbox_mode: 'persistent',
      },
      null,
      {
        title: name ?? agent.name,
        channelId: TEAM_CHANNEL,
        inTransaction: async (tx, conversationId) => {
          const added = await teammates.insertTeammate(tx, {
            accountId: who.accountId,
            agentId: agent.id,
            name,
            conversationId,
          });
          if (!added) throw new AlreadyOnTeam();
          await outbox.enqueue(tx, who.accountId, [changed('team')]);
        },
      },
    );
  } catch (err) {
    if (err instanceof AlreadyOnTeam) return existing();
    throw err;
  }
  await recordAudit(sql, who, 'team.added', { type: 'agent', id: agent.id }, { named: name !== null });
  return { created: true, teammate: await getTeammate(deps, who, agent.id) };
}

/**
 * `POST /api/team/:agent_id/messages`: the prompt becomes the next turn of the teammate's
 * live conversation (sendPrompt: a suspended machine is woken, a gone one built again; 400
 * `conversation_busy` while a turn runs, 503 `provisioning` while its machine is being built,
 * 503 `runner_offline` when its self-hosted runner is away). When that conversation cannot be
 * resumed (terminated, deleted, or never given a sandbox), a fresh one opens on the team
 * channel with the teammate's name, environment and vault and the message as its first
 * prompt; the teammate points at it (with a `team` event). Resolves to the conversation the
 * message went to and the turn it opened. 404 when the agent is not on the team.
 */
export async function messageTeammate(
  deps: Pick<TeamDeps, 'launch'>,
  who: ActorRef,
  agentId: string,
  input: { prompt: string; images?: { data: string; media_type: string }[] },
): Promise<{ conversationId: string; turn: conversations.TurnRow }> {
  const { sql } = deps.launch;
  const mate = await teammateRow(sql, who.accountId, agentId);
  const conv = mate.conversation_id
    ? await conversations.getConversation(sql, who.accountId, mate.conversation_id)
    : undefined;
  if (conv && conv.status !== 'terminated' && conv.sandbox_id !== null) {
    try {
      return { conversationId: conv.id, turn: await sendPrompt(deps.launch, who, conv.id, input) };
    } catch (err) {
      // Terminated between the read and the prompt: it cannot be resumed, as below.
      if (!(err instanceof ApiError && err.code === 'conversation_terminated')) throw err;
    }
  }
  return openFresh(deps.launch, who, mate, conv, input);
}

/**
 * A fresh live conversation for the teammate, on its lasting sandbox for the environment and
 * vault of the one it replaces, titled with its name, with `input` as the first prompt when
 * given. The teammate moves to it (compare-and-set on the conversation it had, with a `team`
 * event) in the launch's transaction: of two requests racing, the second is 400
 * `conversation_busy` (the first one's turn runs), or 404 when the teammate was removed.
 */
async function openFresh(
  deps: LaunchDeps,
  who: ActorRef,
  mate: teammates.TeammateRow,
  previous: conversations.ConversationRow | undefined,
  input: { prompt?: string; images?: { data: string; media_type: string }[] },
): Promise<{ conversationId: string; turn: conversations.TurnRow }> {
  const agent = orNotFound(await agents.getAgent(deps.sql, who.accountId, mate.agent_id), 'Agent');
  const fresh = await startConversation(
    deps,
    who,
    {
      agent_id: agent.id,
      ...(input.prompt ? { prompt: input.prompt } : {}),
      ...(input.images ? { images: input.images } : {}),
      ...(previous?.environment_id ? { environment_id: previous.environment_id } : {}),
      ...(previous?.vault_id ? { vault_id: previous.vault_id } : {}),
      sandbox_mode: 'persistent',
    },
    null,
    {
      title: mate.name ?? agent.name,
      channelId: TEAM_CHANNEL,
      inTransaction: async (tx, conversationId) => {
        if (!(await teammates.moveConversation(tx, who.accountId, agent.id, mate.conversation_id, conversationId))) {
          if (!(await teammates.getTeammate(tx, who.accountId, agent.id))) throw notOnTeam(agent.id);
          throw new ApiError(
            'conversation_busy',
            'Another message just opened a fresh conversation for this teammate.',
          );
        }
        await outbox.enqueue(tx, who.accountId, [changed('team')]);
      },
    },
  );
  const [turn] = await conversations.listTurns(deps.sql, who.accountId, fresh.id);
  return { conversationId: fresh.id, turn: turn as conversations.TurnRow };
}
