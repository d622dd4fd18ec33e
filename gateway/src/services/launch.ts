import { ApiError, newId, orNotFound, type Runtime, validationFailed } from '@svc/core';
import {
  agents,
  conversations,
  credentials,
  environments,
  outbox,
  type Sql,
  sandboxes,
  transaction,
  vaults,
} from '@svc/db';
import { refuseIfSuspended } from './account-standing.ts';
import { recordAudit } from './audit.ts';
import { chargeEndedTurn, requireCredit } from './billing.ts';
import { deleteConversation } from './conversations.ts';
import { runOnSandbox } from './dispatch.ts';
import type { LaunchDeps } from './launch-deps.ts';
import { claimMachine, type Machine, machineOf } from './machine.ts';
import { endTurnResolvingRequests, resolveRequestsOfTurn } from './permissions.ts';
import type { ActorRef } from './principal.ts';
import { findCredential } from './runtime-env.ts';
import { checkCapacity } from './sandboxes.ts';
import { changed } from './tenant-events.ts';
import { decodeImages, endAutonomousTurnForPrompt, openTurn, turnEndEvent } from './turns.ts';

/*
 * The conversation lifecycle: a launch (POST /api/conversations), each prompt after it, an
 * interrupt, the end (terminate) and the deletion. What happens between the records and the
 * runner lives beside this: the machine (machine.ts), the runtime environment
 * (runtime-env.ts), dispatch to the runner (dispatch.ts) and the turn's records (turns.ts).
 */

/** null permits every id, a list only its ids. */
const permits = (list: string[] | null, id: string) => list === null || list.includes(id);

/**
 * `POST /api/conversations`: checks the launch (agent, environment and vault allowlists, the
 * model provider's credential, an online runner for provider `runner`, the sandbox to attach
 * to), records the conversation, its sandbox and its first turn with their `conversations`
 * event in one transaction, and starts the build (unless attached) and the turn.
 *
 * The sandbox (SPEC launch rules 1 and 3): `sandbox_id` attaches to that one (ready or
 * suspended, built for the same agent, environment and vault); a persistent launch uses the
 * identity's own machine when it exists (503 `provisioning` while it is being built) and makes
 * it otherwise; an ephemeral launch gets a new sandbox. A sub-conversation names its parent
 * (`X-Svc-Parent-Conversation-Id`); a sandbox token may start one only under its own
 * conversation. `options.conversationId` launches under an id chosen beforehand (the scheduler's
 * claim), so a caller that retries can see whether the launch already happened.
 * `options.title` and `options.channelId` title the conversation (default: the agent's name)
 * and put it on a channel (the team's). `options.inTransaction` runs inside the transaction
 * that records the conversation, after it is written: what it writes commits with the launch,
 * and what it throws rolls the launch back, before any machine is built or turn run.
 * `options.teamMessage` marks a teammate's fresh conversation opened by a message to it,
 * which a sandbox token may send (the team tools' `send_to_teammate`); a sandbox token's
 * other launches are only sub-conversations of its own conversation. A suspended account
 * launches nothing (403 `account_suspended`, refuseIfSuspended), whoever asks.
 */
export async function startConversation(
  deps: LaunchDeps,
  who: ActorRef & { conversationId?: string | null },
  input: {
    agent_id: string;
    prompt?: string;
    images?: { data: string; media_type: string }[];
    environment_id?: string;
    vault_id?: string;
    sandbox_id?: string;
    sandbox_mode?: 'ephemeral' | 'persistent';
  },
  parentId: string | null = null,
  options: {
    conversationId?: string;
    title?: string;
    channelId?: string;
    inTransaction?: (tx: Sql, conversationId: string) => Promise<void>;
    teamMessage?: boolean;
    /** The first turn's id, chosen beforehand (an in-thread schedule's claim), as conversationId. */
    turnId?: string;
  } = {},
) {
  const { sql } = deps;
  await refuseIfSuspended(sql, who.accountId);
  if (who.actor === 'sprite' && !options.teamMessage) {
    if (parentId === null) {
      throw new ApiError('forbidden', 'A sandbox token starts only sub-conversations (X-Svc-Parent-Conversation-Id).');
    }
    if (parentId !== who.conversationId) {
      throw new ApiError('forbidden', 'A sandbox token starts sub-conversations only under its own conversation.');
    }
  }
  let parentVault: string | null = null;
  if (parentId !== null) {
    const parent = orNotFound(await conversations.getConversation(sql, who.accountId, parentId), 'Parent conversation');
    parentVault = parent.vault_id;
  }
  const agent = orNotFound(await agents.getAgent(sql, who.accountId, input.agent_id), 'Agent');
  const environmentId = input.environment_id ?? agent.environment_id;
  const environment = orNotFound(await environments.getEnvironment(sql, who.accountId, environmentId), 'Environment');
  if (environmentId !== agent.environment_id && !permits(agent.allowed_environment_ids, environmentId)) {
    throw validationFailed({ environment_id: ['is not among the agent’s allowed_environment_ids'] });
  }
  // A sandbox token's sub-conversation runs with its parent's vault or none (DECISIONS: scopes):
  // naming another would hand the parent's agent secrets its own turn does not hold.
  const bySandbox = who.actor === 'sprite' && parentId !== null && !options.teamMessage;
  if (bySandbox && input.vault_id !== undefined && input.vault_id !== null && input.vault_id !== parentVault) {
    throw new ApiError('forbidden', 'A sandbox token’s sub-conversation runs with its parent’s vault or none.');
  }
  const vaultId = input.vault_id ?? (bySandbox ? parentVault : null);
  if (vaultId !== null) {
    orNotFound(await vaults.getVault(sql, who.accountId, vaultId), 'Vault');
    if (!permits(agent.allowed_vault_ids, vaultId)) {
      throw validationFailed({ vault_id: ['is not among the agent’s allowed_vault_ids'] });
    }
  }
  if (input.images?.length && !input.prompt) {
    throw validationFailed({ images: ['come with a prompt'] });
  }
  const images = decodeImages(input.images);
  await requireCredit(sql, deps.billing, who.accountId);
  const credential = await findCredential(deps, who.accountId, agent.runtime as Runtime, agent.model);
  const provider = deps.providers.forAgent(agent.sandbox_provider);
  const mode = input.sandbox_mode ?? (agent.sandbox_mode as 'ephemeral' | 'persistent');

  // The sandbox to run on: the one named, the identity's own persistent machine, or a new one.
  let existing: sandboxes.SandboxRow | undefined;
  if (input.sandbox_id !== undefined) {
    existing = await sandboxes.getSandbox(sql, who.accountId, input.sandbox_id);
    if (!existing) throw new ApiError('sandbox_not_found', 'Sandbox not found.');
    if (existing.status !== 'ready' && existing.status !== 'suspended') {
      throw new ApiError(
        'sandbox_not_attachable',
        `The sandbox is ${existing.status}; only ready or suspended ones take conversations.`,
      );
    }
    if (existing.agent_id !== agent.id || existing.environment_id !== environmentId || existing.vault_id !== vaultId) {
      throw new ApiError(
        'sandbox_identity_mismatch',
        'The sandbox was built for another agent, environment or vault than this launch.',
      );
    }
  } else if (mode === 'persistent') {
    existing = await sandboxes.persistentFor(sql, who.accountId, { agentId: agent.id, environmentId, vaultId });
    if (existing?.status === 'provisioning') {
      throw new ApiError('provisioning', 'The agent’s machine for this environment and vault is still being built.');
    }
  }
  const seen: Machine = existing
    ? await machineOf(deps, who.accountId, existing)
    : {
        gone: true,
        unbuilt: false,
        asleep: false,
        runnerId: await provider.place(who.accountId),
      };

  const conversationId = options.conversationId ?? newId('cnv');
  const turnId = input.prompt ? (options.turnId ?? newId('trn')) : null;
  const { sandbox, machine } = await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    // A new machine, or one built again after it failed, counts against the quota and the fleet.
    if (!existing || existing.status === 'failed' || existing.status === 'terminated') {
      await checkCapacity(t, who.accountId, deps.limits);
    }
    await refuseIfSuspended(t, who.accountId);
    let claimed: { sandbox: sandboxes.SandboxRow; machine: Machine };
    if (existing) {
      claimed = await claimMachine(t, deps, existing, seen);
    } else {
      const row = await sandboxes.insertSandbox(t, {
        id: newId('sbx'),
        accountId: who.accountId,
        provider: provider.name as sandboxes.SandboxRow['provider'],
        mode,
        runnerId: seen.runnerId,
        agentId: agent.id,
        environmentId,
        vaultId,
      });
      // Two persistent launches raced for one identity: the other one is building its machine.
      if (!row)
        throw new ApiError('provisioning', 'The agent’s machine for this environment and vault is being built.');
      claimed = { sandbox: row, machine: seen };
    }
    await conversations.insertConversation(t, {
      id: conversationId,
      accountId: who.accountId,
      agentId: agent.id,
      title: options.title ?? agent.name,
      source: parentId === null ? 'ui' : 'agent',
      parentId,
      channelId: options.channelId ?? null,
      environmentId,
      vaultId,
    });
    await conversations.setSandbox(t, who.accountId, conversationId, claimed.sandbox.id);
    if (turnId && input.prompt) {
      await openTurn(t, {
        id: turnId,
        accountId: who.accountId,
        conversationId,
        prompt: input.prompt,
        images,
        runtime: agent.runtime,
        shared: existing !== undefined,
      });
    }
    await outbox.enqueue(t, who.accountId, [changed('conversations')]);
    await options.inTransaction?.(t, conversationId);
    return claimed;
  });
  await recordAudit(sql, who, 'conversation.created', { type: 'conversation', id: conversationId });

  await runOnSandbox(deps, {
    accountId: who.accountId,
    conversationId,
    sandbox,
    agent,
    environment,
    vaultId,
    credential,
    build: machine.gone,
    wake: machine.asleep,
    turn: turnId && input.prompt ? { id: turnId, prompt: input.prompt, images } : null,
  });

  const row = await conversations.getConversation(sql, who.accountId, conversationId);
  return row as conversations.ConversationRow;
}

/**
 * `POST /api/conversations/:id/prompts`: the next turn. An autonomous turn running ends
 * `done` first (endAutonomousTurnForPrompt). Refused for a suspended account (403
 * `account_suspended`, refuseIfSuspended), while a user's turn runs (400
 * `conversation_busy`), after the conversation ended (410), while another conversation runs
 * a turn on a one-turn sandbox (409 `sandbox_at_capacity`), and when its runner is away (503
 * `runner_offline`), and while another request is building its machine (503 `provisioning`,
 * as for a launch); nothing is recorded then. A sandbox whose machine is gone (failed,
 * terminated, reset) is built again as its next incarnation for the same identity.
 */
export async function sendPrompt(
  deps: LaunchDeps,
  who: ActorRef,
  conversationId: string,
  input: { prompt: string; images?: { data: string; media_type: string }[] },
  options: { turnId?: string } = {},
): Promise<conversations.TurnRow> {
  const { sql } = deps;
  await refuseIfSuspended(sql, who.accountId);
  const conv = await conversations.getConversation(sql, who.accountId, conversationId);
  if (!conv) throw new ApiError('not_found', 'Conversation not found.');
  if (conv.status === 'terminated') throw new ApiError('conversation_terminated');
  // An autonomous turn gives way to a person's prompt (below, once the prompt can run); a
  // user's turn running is busy.
  if (
    conv.status === 'running' &&
    (await conversations.runningTurn(sql, who.accountId, conversationId))?.origin !== 'autonomous'
  ) {
    throw new ApiError('conversation_busy');
  }
  const agent = await agents.getAgent(sql, who.accountId, conv.agent_id);
  if (!agent) throw new ApiError('not_found', 'The conversation’s agent was deleted.');
  const environment = await environments.getEnvironment(
    sql,
    who.accountId,
    conv.environment_id ?? agent.environment_id,
  );
  if (!environment) throw new ApiError('not_found', 'The conversation’s environment was deleted.');
  const images = decodeImages(input.images);
  await requireCredit(sql, deps.billing, who.accountId);
  const credential = await findCredential(deps, who.accountId, agent.runtime as Runtime, agent.model);

  const current = conv.sandbox_id ? await sandboxes.getSandbox(sql, who.accountId, conv.sandbox_id) : undefined;
  if (!current) throw new ApiError('not_found', 'The conversation has no sandbox.');
  const seen = await machineOf(deps, who.accountId, current);

  await endAutonomousTurnForPrompt(deps, who.accountId, conversationId);
  const turnId = options.turnId ?? newId('trn');
  const { turn, sandbox, machine } = await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    await refuseIfSuspended(t, who.accountId);
    const opened = await openTurn(t, {
      id: turnId,
      accountId: who.accountId,
      conversationId,
      prompt: input.prompt,
      images,
      runtime: agent.runtime,
      shared: true,
    });
    const claimed = await claimMachine(t, deps, current, seen);
    await outbox.enqueue(t, who.accountId, [changed('conversations')]);
    return { turn: opened, ...claimed };
  });
  await recordAudit(sql, who, 'conversation.prompted', { type: 'conversation', id: conversationId });

  await runOnSandbox(deps, {
    accountId: who.accountId,
    conversationId,
    sandbox,
    agent,
    environment,
    vaultId: conv.vault_id,
    credential,
    build: machine.gone,
    wake: machine.asleep,
    turn: { id: turnId, prompt: input.prompt, images },
  });
  return turn;
}

/**
 * `POST /api/conversations/:id/interrupt`: the running turn is cancelled on its runner and
 * ends `interrupted` there; the sandbox stays. When the runner is away, the turn is ended
 * `interrupted` here, with a stage event saying so. Nothing running: nothing to do.
 */
export async function interruptConversation(deps: LaunchDeps, who: ActorRef, conversationId: string) {
  const { sql } = deps;
  const conv = await conversations.getConversation(sql, who.accountId, conversationId);
  if (!conv) throw new ApiError('not_found', 'Conversation not found.');
  if (conv.status === 'terminated') throw new ApiError('conversation_terminated');
  const turn = await conversations.runningTurn(sql, who.accountId, conversationId);
  if (!turn) return conv;
  const sandbox = conv.sandbox_id ? await sandboxes.getSandbox(sql, who.accountId, conv.sandbox_id) : undefined;
  try {
    if (!sandbox?.runner_id) throw new ApiError('runner_offline');
    await deps.fabric.command(sandbox.runner_id, {
      kind: 'turn.interrupt',
      sandbox: sandbox.id,
      conversation_id: conversationId,
      turn_id: turn.id,
    });
  } catch (err) {
    if (!(err instanceof ApiError) || err.code !== 'runner_offline') throw err;
    await endTurnResolvingRequests(sql, who.accountId, turn.id, 'interrupted', null, [
      turnEndEvent(conversationId, turn.id, 'interrupted', 'the runner is not connected; the turn was ended here'),
      changed('conversations'),
    ]);
    await chargeEndedTurn(sql, deps.billing, who.accountId, turn.id);
    await deps.relay.flush(who.accountId);
  }
  await recordAudit(sql, who, 'conversation.interrupted', { type: 'conversation', id: conversationId });
  return (await conversations.getConversation(sql, who.accountId, conversationId)) ?? conv;
}

/** What ending a conversation's record found: what `afterTermination` still has to do. */
export type Terminated = NonNullable<Awaited<ReturnType<typeof conversations.terminate>>>;

/**
 * The record of a conversation's end, in `sql`'s transaction (or one of its own): the
 * conversation `terminated`, a running turn `interrupted`, their events in the outbox, its
 * sandbox tokens revoked and the `conversation.terminated` audit row. 410
 * `conversation_terminated` when it already ended, 404 when it does not exist. What lies beyond
 * the database (the runner, the machine) is `afterTermination`, once this has committed.
 */
export async function terminateRecord(sql: Sql, who: ActorRef, conversationId: string): Promise<Terminated> {
  return transaction(sql, async (tx) => {
    const ended = await conversations.terminate(tx, who.accountId, conversationId, (turnId) => [
      ...(turnId ? [turnEndEvent(conversationId, turnId, 'interrupted', 'the conversation was terminated')] : []),
      { conversationId, turnId: null, kind: 'stage', stream: 'stage', stage: 'terminate', state: 'done' },
      changed('conversations'),
    ]);
    if (!ended) {
      const exists = await conversations.getConversation(tx, who.accountId, conversationId);
      throw exists ? new ApiError('conversation_terminated') : new ApiError('not_found', 'Conversation not found.');
    }
    await credentials.revokeSandboxTokens(tx, who.accountId, conversationId);
    await recordAudit(tx, who, 'conversation.terminated', { type: 'conversation', id: conversationId });
    return ended;
  });
}

/**
 * What follows a committed `terminateRecord`: the interrupted turn's permission requests
 * resolved and its charge, the events relayed, the runtime stopped, and the sandbox destroyed
 * unless it is persistent or another live conversation shares it. Best effort beyond the
 * database: a runner that is away has nothing running for the conversation.
 */
export async function afterTermination(
  deps: LaunchDeps,
  who: ActorRef,
  conversationId: string,
  ended: Terminated,
): Promise<void> {
  const { sql } = deps;
  if (ended.interruptedTurnId) {
    await resolveRequestsOfTurn(sql, who.accountId, ended.interruptedTurnId);
    await chargeEndedTurn(sql, deps.billing, who.accountId, ended.interruptedTurnId);
  }
  await deps.relay.flush(who.accountId);
  const sandbox = ended.sandboxId ? await sandboxes.getSandbox(sql, who.accountId, ended.sandboxId) : undefined;
  if (!sandbox) return;
  const destroy = sandbox.mode === 'ephemeral' && ended.othersOnSandbox === 0;
  if (destroy) await sandboxes.moveStatus(sql, sandbox.id, ['provisioning', 'ready', 'suspended'], 'terminated');
  // The machine is told when it is reachable; one that is away has nothing running for it.
  const runner = sandbox.runner_id;
  if (runner) {
    await deps.fabric
      .command(runner, { kind: 'conversation.close', sandbox: sandbox.id, conversation_id: conversationId })
      .then(() =>
        destroy
          ? deps.fabric.command(runner, {
              kind: 'sandbox.destroy',
              sandbox: sandbox.id,
              incarnation: sandbox.incarnation,
            })
          : undefined,
      )
      .catch((err: Error) =>
        deps.logger.warn({ err: { message: err.message }, sandbox: sandbox.id }, 'terminate: runner not told'),
      );
  }
  if (destroy) {
    await deps.providers
      .of(sandbox.provider)
      .destroy(sandbox)
      .catch((err: Error) =>
        deps.logger.warn({ err: { message: err.message }, sandbox: sandbox.id }, 'terminate: machine not destroyed'),
      );
  }
}

/**
 * `POST /api/conversations/:id/terminate`: the conversation ends (410 afterwards), a running
 * turn ends `interrupted`, its runtime stops, and its sandbox is destroyed unless it is
 * persistent or another live conversation shares it (terminateRecord, then afterTermination).
 */
export async function terminateConversation(deps: LaunchDeps, who: ActorRef, conversationId: string) {
  const ended = await terminateRecord(deps.sql, who, conversationId);
  await afterTermination(deps, who, conversationId, ended);
  return (await conversations.getConversation(
    deps.sql,
    who.accountId,
    conversationId,
  )) as conversations.ConversationRow;
}

/**
 * `DELETE /api/conversations/:id`: a live conversation is terminated first (its runtime stops,
 * its ephemeral sandbox goes), then it is deleted with its turns and log. What its runtime
 * still sends afterwards is dropped by the fabric.
 */
export async function removeConversation(deps: LaunchDeps, who: ActorRef, conversationId: string): Promise<void> {
  const conv = await conversations.getConversation(deps.sql, who.accountId, conversationId);
  if (!conv) throw new ApiError('not_found', 'Conversation not found.');
  if (conv.status !== 'terminated') {
    await terminateConversation(deps, who, conversationId).catch((err: unknown) => {
      // Terminated meanwhile by another request: nothing left to stop.
      if (!(err instanceof ApiError && err.code === 'conversation_terminated')) throw err;
    });
  }
  await deleteConversation(deps.sql, who, conversationId);
}
