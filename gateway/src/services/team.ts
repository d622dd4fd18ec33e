import { ApiError, orNotFound, TEAM_CHANNEL, type TeammateCreate } from '@svc/core';
import { agents, conversations, outbox, type Sql, sandboxes, teammates, transaction } from '@svc/db';
import type { z } from 'zod';
import { recordAudit } from './audit.ts';
import { shapeConversation } from './conversations.ts';
import {
  afterTermination,
  sendPrompt,
  startConversation,
  type Terminated,
  terminateConversation,
  terminateRecord,
} from './launch.ts';
import type { LaunchDeps } from './launch-deps.ts';
import type { ActorRef } from './principal.ts';
import { getTeammate, notOnTeam, type TeamDeps, type TeammateEntry, teammateRow } from './team-roster.ts';
import { changed } from './tenant-events.ts';

/*
 * The team: agents bound to the reserved channel `svc:team`, each with one lasting sandbox
 * (its persistent machine) and one live conversation at a time. Every change to the roster
 * writes the tenant's `team` change event in the transaction of the change. Reads are in
 * team-roster.ts.
 */

export {
  getTeammate,
  listTeamConversations,
  listTeammates,
  type TeamDeps,
  type TeammateEntry,
} from './team-roster.ts';

/** A custom name as stored: trimmed; blank or null keeps the agent's name (null). */
function customName(name: string | null | undefined): string | null {
  const trimmed = name?.trim() ?? '';
  return trimmed === '' ? null : trimmed;
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
 * prompt; the teammate points at it (with a `team` event), whoever sent the message (a
 * teammate's sandbox token through the team tools too). Resolves to the conversation the
 * message went to and the turn it opened. 404 when the agent is not on the team.
 */
export async function messageTeammate(
  deps: Pick<TeamDeps, 'launch'>,
  who: ActorRef,
  agentId: string,
  input: { prompt: string; images?: { data: string; media_type: string }[] },
  options: { turnId?: string } = {},
): Promise<{ conversationId: string; turn: conversations.TurnRow }> {
  const { sql } = deps.launch;
  const mate = await teammateRow(sql, who.accountId, agentId);
  const conv = mate.conversation_id
    ? await conversations.getConversation(sql, who.accountId, mate.conversation_id)
    : undefined;
  if (conv && conv.status !== 'terminated' && conv.sandbox_id !== null) {
    await refuseWhileBuilding(deps.launch, who, conv.sandbox_id);
    try {
      return { conversationId: conv.id, turn: await sendPrompt(deps.launch, who, conv.id, input, options) };
    } catch (err) {
      // Terminated between the read and the prompt: it cannot be resumed, as below.
      if (!(err instanceof ApiError && err.code === 'conversation_terminated')) throw err;
    }
  }
  const fresh = await openConversation(deps.launch, who, mate, conv, { ...input, ...options, teamMessage: true });
  const [turn] = await conversations.listTurns(sql, who.accountId, fresh.id);
  return { conversationId: fresh.id, turn: turn as conversations.TurnRow };
}

/** A message or a start-over waits while the teammate's machine is being built (or woken). */
const stillBuilding = () =>
  new ApiError('provisioning', 'The teammate’s machine is still being built; try again shortly.');

/** 503 `provisioning` while the sandbox's machine is being built (or woken). */
async function refuseWhileBuilding(deps: LaunchDeps, who: ActorRef, sandboxId: string): Promise<void> {
  if ((await sandboxes.getSandbox(deps.sql, who.accountId, sandboxId))?.status === 'provisioning') {
    throw stillBuilding();
  }
}

/**
 * A new live conversation for the teammate, titled with its name, for the environment and
 * vault of the one it replaces: on `sandboxId` when given (attached: nothing is built), else
 * on its lasting sandbox (built when it has none), with `prompt` as the first turn when given.
 * The teammate moves to it (compare-and-set on the conversation it had, with a `team` event)
 * in the launch's transaction: of two requests racing, the second is 400 `conversation_busy`,
 * or 404 when the teammate was removed meanwhile. `inTransaction` adds to that transaction
 * (a rotation retires the previous conversation there).
 */
async function openConversation(
  deps: LaunchDeps,
  who: ActorRef,
  mate: teammates.TeammateRow,
  previous: conversations.ConversationRow | undefined,
  input: {
    prompt?: string;
    images?: { data: string; media_type: string }[];
    sandboxId?: string;
    teamMessage?: boolean;
    turnId?: string;
    inTransaction?: (tx: Sql, conversationId: string) => Promise<void>;
  },
): Promise<conversations.ConversationRow> {
  const agent = orNotFound(await agents.getAgent(deps.sql, who.accountId, mate.agent_id), 'Agent');
  return startConversation(
    deps,
    who,
    {
      agent_id: agent.id,
      ...(input.prompt ? { prompt: input.prompt } : {}),
      ...(input.images ? { images: input.images } : {}),
      ...(previous?.environment_id ? { environment_id: previous.environment_id } : {}),
      ...(previous?.vault_id ? { vault_id: previous.vault_id } : {}),
      ...(input.sandboxId ? { sandbox_id: input.sandboxId } : { sandbox_mode: 'persistent' as const }),
    },
    null,
    {
      title: mate.name ?? agent.name,
      channelId: TEAM_CHANNEL,
      teamMessage: input.teamMessage ?? false,
      ...(input.turnId ? { turnId: input.turnId } : {}),
      inTransaction: async (tx, conversationId) => {
        if (!(await teammates.moveConversation(tx, who.accountId, agent.id, mate.conversation_id, conversationId))) {
          if (!(await teammates.getTeammate(tx, who.accountId, agent.id))) throw notOnTeam(agent.id);
          throw new ApiError(
            'conversation_busy',
            'Another request just opened a fresh conversation for this teammate.',
          );
        }
        await outbox.enqueue(tx, who.accountId, [changed('team')]);
        await input.inTransaction?.(tx, conversationId);
      },
    },
  );
}

/** Ends a conversation; one that already ended, or is gone, needs nothing more. */
async function endIfLive(deps: LaunchDeps, who: ActorRef, conversationId: string): Promise<void> {
  await terminateConversation(deps, who, conversationId).catch((err: unknown) => {
    const done = err instanceof ApiError && (err.code === 'conversation_terminated' || err.code === 'not_found');
    if (!done) throw err;
  });
}

/**
 * `POST /api/team/:agent_id/conversations`: starts the teammate over on its machine. A new
 * live conversation opens on the current one's sandbox when that is ready or suspended
 * (attached: nothing is built or interrupted; a suspended machine is woken for it), else as
 * `POST /api/team` provisions (its machine failed, was destroyed, or it never had one). The
 * current one is retired (terminated, its persistent machine kept) in the transaction that
 * opens the new one and moves the teammate to it, with the `team.conversation.rotated` audit
 * row: a node that dies midway leaves either the old conversation live or the new one, never
 * both. 400 `conversation_busy` while a turn runs (also when one started just before the
 * transaction: nothing is opened then); 503 `provisioning` while its machine is being built.
 */
export async function rotateTeammate(
  deps: TeamDeps,
  who: ActorRef,
  agentId: string,
): Promise<{ teammate: TeammateEntry; conversation: ReturnType<typeof shapeConversation> }> {
  const { sql } = deps.launch;
  const mate = await teammateRow(sql, who.accountId, agentId);
  const current = mate.conversation_id
    ? await conversations.getConversation(sql, who.accountId, mate.conversation_id)
    : undefined;
  if (current?.status === 'running') throw new ApiError('conversation_busy');
  const sandbox = current?.sandbox_id ? await sandboxes.getSandbox(sql, who.accountId, current.sandbox_id) : undefined;
  if (sandbox?.status === 'provisioning') throw stillBuilding();
  const keep = sandbox && (sandbox.status === 'ready' || sandbox.status === 'suspended') ? sandbox.id : undefined;
  const retiring = current && current.status !== 'terminated' ? current.id : undefined;
  let retired: Terminated | undefined;
  const fresh = await openConversation(deps.launch, who, mate, current, {
    ...(keep ? { sandboxId: keep } : {}),
    inTransaction: async (tx, conversationId) => {
      if (retiring) {
        retired = await terminateRecord(tx, who, retiring).catch((err: unknown) => {
          // Ended (or deleted) since it was read: nothing is left to retire.
          if (err instanceof ApiError && (err.code === 'conversation_terminated' || err.code === 'not_found')) {
            return undefined;
          }
          throw err;
        });
        // A turn began after the check above: the teammate is busy, and nothing is opened.
        if (retired?.interruptedTurnId) throw new ApiError('conversation_busy');
      }
      await recordAudit(
        tx,
        who,
        'team.conversation.rotated',
        { type: 'agent', id: agentId },
        { from: current?.id ?? null, to: conversationId, machine_kept: keep !== undefined },
      );
    },
  });
  if (retiring && retired) await afterTermination(deps.launch, who, retiring, retired);
  return { teammate: await getTeammate(deps, who, agentId), conversation: shapeConversation(fresh) };
}

/**
 * `PATCH /api/team/:agent_id`: the custom name, which titles the live conversation and every
 * later fresh one; null or blank restores the agent's name. Audited as `team.renamed`, with
 * `team` and `conversations` events (a title changed).
 */
export async function renameTeammate(
  deps: TeamDeps,
  who: ActorRef,
  agentId: string,
  input: { name: string | null },
): Promise<TeammateEntry> {
  const { sql } = deps.launch;
  const agent = orNotFound(await agents.getAgent(sql, who.accountId, agentId), 'Agent');
  const name = customName(input.name);
  await transaction(sql, async (tx) => {
    if (!(await teammates.rename(tx, who.accountId, agentId, name, name ?? agent.name))) throw notOnTeam(agentId);
    await outbox.enqueue(tx, who.accountId, [changed('team'), changed('conversations')]);
    await recordAudit(tx, who, 'team.renamed', { type: 'agent', id: agentId }, { restored: name === null });
  });
  return getTeammate(deps, who, agentId);
}

/**
 * `DELETE /api/team/:agent_id`: terminates the live conversation (its persistent machine is
 * kept) and takes the agent off the team, unbinding its team history: its conversations leave
 * the team channel (`GET /api/conversations?channel_id=svc:team` no longer lists them), with a
 * `team` event. 404 when the agent is not on the team.
 */
export async function removeTeammate(deps: Pick<TeamDeps, 'launch'>, who: ActorRef, agentId: string): Promise<void> {
  const { sql } = deps.launch;
  const mate = await teammateRow(sql, who.accountId, agentId);
  if (mate.conversation_id) await endIfLive(deps.launch, who, mate.conversation_id);
  await transaction(sql, async (tx) => {
    if (!(await teammates.removeTeammate(tx, who.accountId, agentId))) throw notOnTeam(agentId);
    await outbox.enqueue(tx, who.accountId, [changed('team'), changed('conversations')]);
    await recordAudit(tx, who, 'team.removed', { type: 'agent', id: agentId });
  });
}
