import { ApiError, presenceOf, TEAM_CHANNEL, type TeamConversation, type Teammate } from '@svc/core';
import { agents, conversations, type Sql, teammates } from '@svc/db';
import type { z } from 'zod';
import { runnerOnline } from '../fabric/presence.ts';
import { shapeAgent } from './agent-shape.ts';
import { shapeConversation, shapeTurn } from './conversations.ts';
import type { LaunchDeps } from './launch-deps.ts';
import { unbuiltMachine } from './machine.ts';
import type { ActorRef } from './principal.ts';

/*
 * The team as it is read: roster entries (name, agent, live conversation, presence, unread,
 * last turn, preview, usage) and a teammate's team history. Presence is the rule in core
 * (presenceOf) over signals gathered here.
 */

export interface TeamDeps {
  launch: LaunchDeps;
  /** A runner not heard from for this long is offline (RUNNER_GRACE_MS, as GET /api/runners). */
  runnerOfflineAfterMs: number;
}

export type TeammateEntry = z.infer<typeof Teammate>;

/** A preview's text is the start of a prompt or a reply. */
const PREVIEW_CHARS = 280;

/** 404 for an agent that is not on the caller's team (unknown, another tenant's, or never added). */
export const notOnTeam = (agentId: string) => new ApiError('not_found', `Agent ${agentId} is not on the team.`);

/** The caller's teammate row of the agent; 404 when it is not on the team. */
export async function teammateRow(sql: Sql, accountId: string, agentId: string) {
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
  const usageByAgent = new Map(
    (
      await teammates.teamUsage(
        sql,
        accountId,
        rows.map((r) => r.agent_id),
      )
    ).map((u) => [u.agent_id, u]),
  );
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
      sandbox: sandbox && !unbuiltMachine(sandbox) ? sandbox.status : null,
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

/**
 * `GET /api/team/:agent_id/conversations`: every conversation the agent has on the team
 * channel, newest first, its live one flagged `current`. 404 when it is not on the team.
 */
export async function listTeamConversations(
  deps: Pick<TeamDeps, 'launch'>,
  who: ActorRef,
  agentId: string,
): Promise<z.infer<typeof TeamConversation>[]> {
  const { sql } = deps.launch;
  const mate = await teammateRow(sql, who.accountId, agentId);
  const rows = await conversations.onChannel(sql, who.accountId, agentId, TEAM_CHANNEL);
  return rows.map((c) => ({ ...shapeConversation(c), current: c.id === mate.conversation_id }));
}
