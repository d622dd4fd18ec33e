import { ApiError, newId, providerOf, type Runtime, validationFailed } from '@svc/core';
import { agents, conversations, environments, outbox, runners, type Sql, sandboxes, vaults } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { Redaction } from '../log/log.append.ts';
import type { LocalSandboxes } from '../sandboxes/local.ts';
import type { Keyring } from '../secrets/keyring.ts';
import type { OutboxRelay } from '../workers/outbox-relay.ts';
import { recordAudit } from './audit.ts';
import { revealCredential } from './inference-credentials.ts';
import type { ActorRef } from './principal.ts';
import { revealSecrets } from './secrets.ts';
import { changed } from './tenant-events.ts';

export interface LaunchDeps {
  sql: Sql;
  keyring: Keyring;
  fabric: RunnerFabric;
  redaction: Redaction;
  logger: Logger;
  /** The command line that starts each runtime's ACP agent on the runner (RUNTIME_<NAME>_COMMAND). */
  runtimeCommands: Record<Runtime, string>;
  turnTimeLimitMs: number;
  /** An unanswered permission request is denied after this long (PERMISSION_TIMEOUT_S). */
  permissionTimeoutMs: number;
  /** Runners heard from within this long count as online. */
  offlineAfterMs: number;
  /** The provider of agents that name none (SANDBOX_PROVIDER_DEFAULT). */
  defaultProvider: 'local' | 'runner';
  local: LocalSandboxes;
  relay: OutboxRelay;
}

/** The credential each model provider's runtime reads, in the order they are tried. */
const CREDENTIALS: Record<
  string,
  { provider: 'anthropic_api_key' | 'claude_code_oauth_token' | 'openai_api_key' | 'gemini_api_key'; env: string }[]
> = {
  anthropic: [
    { provider: 'anthropic_api_key', env: 'ANTHROPIC_API_KEY' },
    { provider: 'claude_code_oauth_token', env: 'CLAUDE_CODE_OAUTH_TOKEN' },
  ],
  openai: [{ provider: 'openai_api_key', env: 'OPENAI_API_KEY' }],
  google: [{ provider: 'gemini_api_key', env: 'GEMINI_API_KEY' }],
};

/** Splits a configured command line on spaces (quotes group words). */
export function commandLine(line: string): { command: string; args: string[] } {
  const words = [...line.matchAll(/"([^"]*)"|'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2] ?? m[3] ?? '');
  return { command: words[0] ?? '', args: words.slice(1) };
}

/** null permits every id, a list only its ids. */
const permits = (list: string[] | null, id: string) => list === null || list.includes(id);

/**
 * `POST /api/conversations` on provider `runner`: checks the launch (agent, environment and
 * vault allowlists, the model provider's credential, an online runner), records the
 * conversation, its sandbox and its first turn with their `conversations` event in one
 * transaction, and starts the build and the turn on the runner. Failures after the answer
 * are reported in the conversation's log and end the turn `failed`, never left running.
 */
export async function startConversation(
  deps: LaunchDeps,
  who: ActorRef,
  input: {
    agent_id: string;
    prompt?: string;
    environment_id?: string;
    vault_id?: string;
    sandbox_mode?: 'ephemeral' | 'persistent';
  },
) {
  const { sql } = deps;
  const agent = await agents.getAgent(sql, who.accountId, input.agent_id);
  if (!agent) throw new ApiError('not_found', 'Agent not found.');
  const environmentId = input.environment_id ?? agent.environment_id;
  const environment = await environments.getEnvironment(sql, who.accountId, environmentId);
  if (!environment) throw new ApiError('not_found', 'Environment not found.');
  if (environmentId !== agent.environment_id && !permits(agent.allowed_environment_ids, environmentId)) {
    throw validationFailed({ environment_id: ['is not among the agent’s allowed_environment_ids'] });
  }
  const vaultId = input.vault_id ?? null;
  if (vaultId !== null) {
    if (!(await vaults.getVault(sql, who.accountId, vaultId))) throw new ApiError('not_found', 'Vault not found.');
    if (!permits(agent.allowed_vault_ids, vaultId)) {
      throw validationFailed({ vault_id: ['is not among the agent’s allowed_vault_ids'] });
    }
  }
  const modelProvider = providerOf(agent.model) ?? '';
  const credential = await findCredential(deps, who.accountId, modelProvider);
  const provider = agent.sandbox_provider ?? deps.defaultProvider;
  if (provider !== 'runner' && provider !== 'local') {
    throw validationFailed(
      { sandbox_provider: [`${provider} is not available on this instance yet; use runner`] },
      `Sandbox provider ${provider} is not available on this instance yet.`,
    );
  }
  let runnerId: string | null = null;
  if (provider === 'runner') {
    const runner = (await runners.listRunners(sql, who.accountId)).find(
      (r) =>
        deps.fabric.isLive(r.id) &&
        r.last_seen_at !== null &&
        Date.now() - r.last_seen_at.getTime() < deps.offlineAfterMs,
    );
    if (!runner) throw new ApiError('no_runner_online', 'No runner of this account is online: start svc-runner first.');
    runnerId = runner.id;
  }

  const conversationId = newId('cnv');
  const sandboxId = newId('sbx');
  const turnId = input.prompt ? newId('trn') : null;
  await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    await sandboxes.insertSandbox(t, {
      id: sandboxId,
      accountId: who.accountId,
      provider,
      mode: input.sandbox_mode ?? (agent.sandbox_mode as 'ephemeral' | 'persistent'),
      runnerId,
      agentId: agent.id,
      environmentId,
      vaultId,
    });
    await conversations.insertConversation(t, {
      id: conversationId,
      accountId: who.accountId,
      agentId: agent.id,
      title: agent.name,
      source: 'ui',
      environmentId,
      vaultId,
    });
    await conversations.setSandbox(t, who.accountId, conversationId, sandboxId);
    if (turnId && input.prompt) {
      await conversations.startTurn(t, {
        id: turnId,
        accountId: who.accountId,
        conversationId,
        prompt: input.prompt,
        origin: 'user',
      });
    }
    await outbox.enqueue(t, who.accountId, [changed('conversations')]);
  });
  await recordAudit(sql, who, 'conversation.created', { type: 'conversation', id: conversationId });

  // Vault wins over environment; the model's credential is placed the way its runtime reads it.
  const env: Record<string, string> = {
    ...environment.env_vars,
    ...(await revealSecrets(deps, 'environment', who.accountId, environmentId)),
    ...(vaultId ? await revealSecrets(deps, 'vault', who.accountId, vaultId) : {}),
  };
  const runtimeEnv: Record<string, string> = { ...env, SVC_MODEL: agent.model };
  if (credential) runtimeEnv[credential.env] = credential.value;
  deps.redaction.register(who.accountId, conversationId, Object.values(runtimeEnv));

  void (async () => {
    let onRunner = runnerId;
    if (onRunner === null) {
      // local: the sandbox's own runner-agent, started now and connected back.
      const started = Date.now();
      await emitStage(deps, who.accountId, { conversationId, turnId, stage: 'sandbox', state: 'started' });
      onRunner = await deps.local.start(who.accountId, sandboxId);
      await sandboxes.setRunner(sql, sandboxId, onRunner);
      await emitStage(deps, who.accountId, {
        conversationId,
        turnId,
        stage: 'sandbox',
        state: 'done',
        durationMs: Date.now() - started,
      });
    }
    const target = onRunner;
    await deps.fabric.command(target, {
      kind: 'sandbox.create',
      sandbox: sandboxId,
      incarnation: 0,
      conversation_id: conversationId,
      env,
      setup_script: environment.setup_script || null,
    });
    if (turnId && input.prompt) {
      const { command, args } = commandLine(deps.runtimeCommands[agent.runtime as Runtime]);
      await deps.fabric.command(target, {
        kind: 'turn.start',
        sandbox: sandboxId,
        incarnation: 0,
        conversation_id: conversationId,
        turn_id: turnId,
        prompt: input.prompt,
        runtime: { command, args, env: runtimeEnv },
        time_limit_ms: deps.turnTimeLimitMs,
        permission_policy: agent.permission_policy as { default: 'auto_allow' | 'ask'; ask: string[] },
        permission_timeout_ms: deps.permissionTimeoutMs,
      });
    }
  })().catch(async (err: Error) => {
    deps.logger.warn({ err: { message: err.message }, conversation: conversationId }, 'launch failed');
    await failLaunch(deps.sql, who.accountId, conversationId, turnId, err.message).catch(() => {});
  });

  const row = await conversations.getConversation(sql, who.accountId, conversationId);
  return row as conversations.ConversationRow;
}

async function findCredential(deps: LaunchDeps, accountId: string, modelProvider: string) {
  const choices = CREDENTIALS[modelProvider];
  if (!choices) return undefined; // providers whose runtime reads its own configuration (opencode's others)
  for (const c of choices) {
    const value = await revealCredential(deps, accountId, c.provider);
    if (value) return { env: c.env, value };
  }
  throw new ApiError(
    'missing_credential',
    `Set ${choices.map((c) => c.provider).join(' or ')} first: PUT /api/account/inference-credentials/${choices[0]?.provider}.`,
    {
      extra: { details: { provider: choices.map((c) => c.provider) } },
    },
  );
}

/**
 * A stage event the service emits (through the outbox), in the log before the caller goes on,
 * so the runner's events that follow come after it.
 */
async function emitStage(
  deps: LaunchDeps,
  accountId: string,
  e: { conversationId: string; turnId: string | null; stage: string; state: string; durationMs?: number },
): Promise<void> {
  await deps.sql.begin((tx) =>
    outbox.enqueue(tx as unknown as Sql, accountId, [
      {
        conversationId: e.conversationId,
        turnId: e.turnId,
        kind: 'stage',
        stream: 'stage',
        stage: e.stage,
        state: e.state,
        durationMs: e.durationMs ?? null,
      },
    ]),
  );
  await deps.relay.flush(accountId);
}

/** The launch failed after the answer: say so in the log, end the turn `failed`. */
async function failLaunch(sql: Sql, accountId: string, conversationId: string, turnId: string | null, message: string) {
  await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    await outbox.enqueue(t, accountId, [
      { conversationId, turnId, kind: 'stage', stream: 'stage', stage: 'sandbox', state: 'failed', data: message },
    ]);
  });
  if (turnId) {
    await conversations.endTurn(sql, accountId, turnId, 'failed', null, [changed('conversations')]);
  }
}
