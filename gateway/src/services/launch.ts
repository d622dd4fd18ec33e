import {
  ApiError,
  AVATAR_TYPES,
  newId,
  Packages,
  PROMPT_IMAGE_MAX_BYTES,
  providerOf,
  type Runtime,
  type SandboxCreateCommand,
  sniffImage,
  validationFailed,
} from '@svc/core';
import { agents, conversations, credentials, environments, outbox, type Sql, sandboxes, vaults } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { Redaction } from '../log/log.append.ts';
import type { SandboxProvider, SandboxProviders } from '../sandboxes/provider.ts';
import type { Keyring } from '../secrets/keyring.ts';
import type { OutboxRelay } from '../workers/outbox-relay.ts';
import { recordAudit } from './audit.ts';
import { deleteConversation } from './conversations.ts';
import { issueSandboxToken } from './credentials.ts';
import { revealCredential } from './inference-credentials.ts';
import { endTurnResolvingRequests, resolveRequestsOfTurn } from './permissions.ts';
import type { ActorRef } from './principal.ts';
import { credentialsFor, runtimeSettings } from './runtime-settings.ts';
import { checkCapacity, type SandboxLimits } from './sandboxes.ts';
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
  /** Where sandboxes' machines come from, by provider (and the default for agents naming none). */
  providers: SandboxProviders;
  relay: OutboxRelay;
  /** The service's base URL as a sandbox's runtime reaches it (SVC_API_URL). */
  apiUrl: () => string;
  limits: SandboxLimits;
  /**
   * The base URL of each model provider's API by the provider part of a model name
   * (`anthropic`, `openai`, `google`: ANTHROPIC_BASE_URL, OPENAI_BASE_URL, GEMINI_BASE_URL):
   * an egress allowlist always lets the runtime reach its provider.
   */
  providerUrls: Record<string, string>;
}

/**
 * A sandbox's egress policy (DECISIONS: `allowed_hosts` is enforced by the runner): null for an
 * environment without `networking_config` (unrestricted); otherwise its allowlist plus the
 * host of the agent's model provider and of the service itself (SVC_API_URL, which the runtime
 * calls for sub-conversations), so a list, even empty, never cuts the runtime off from either.
 */
function networkPolicy(deps: LaunchDeps, environment: EnvironmentRow, agent: AgentRow) {
  if (!environment.networking_config) return null;
  const always = [deps.providerUrls[providerOf(agent.model) ?? ''], deps.apiUrl()].flatMap((u) =>
    u ? [new URL(u).host] : [],
  );
  return { allowed_hosts: [...new Set([...environment.networking_config.allowed_hosts, ...always])] };
}

/** Splits a configured command line on spaces (quotes group words). */
export function commandLine(line: string): { command: string; args: string[] } {
  const words = [...line.matchAll(/"([^"]*)"|'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2] ?? m[3] ?? '');
  return { command: words[0] ?? '', args: words.slice(1) };
}

/** null permits every id, a list only its ids. */
const permits = (list: string[] | null, id: string) => list === null || list.includes(id);

type AgentRow = NonNullable<Awaited<ReturnType<typeof agents.getAgent>>>;
type EnvironmentRow = NonNullable<Awaited<ReturnType<typeof environments.getEnvironment>>>;

function policyOf(agent: AgentRow) {
  return agent.permission_policy as { default: 'auto_allow' | 'ask'; ask: string[] };
}

/** Runtimes whose sandbox runs one turn at a time (SPEC launch rule 2). */
const ONE_TURN_PER_SANDBOX = new Set(['opencode', 'gemini']);

/** What the runner builds besides the directory: the environment's repositories and packages, the agent's skills. */
function buildStages(agent: AgentRow, environment: EnvironmentRow) {
  const packages = Packages.safeParse(environment.packages);
  return {
    repositories: environment.repositories,
    packages: packages.success ? { apt: packages.data.apt ?? [], npm: packages.data.npm ?? [] } : {},
    skills: agent.skills as SandboxCreateCommand['skills'],
  };
}

function mcpServersOf(agent: AgentRow) {
  return Object.entries(agent.mcp_servers).map(([name, m]) => ({ name, command: m.command, args: m.args ?? [] }));
}

/**
 * Images sent with a prompt, decoded and checked by their bytes: each must be png, jpeg, gif
 * or webp and agree with its declared type (415), and fit in 5 MB (413).
 */
function decodeImages(images: { data: string; media_type: string }[] | undefined) {
  return (images ?? []).map((image, i) => {
    const declared = image.media_type.split(';')[0]?.trim().toLowerCase() ?? '';
    const bytes = Buffer.from(image.data, 'base64');
    if (bytes.length > PROMPT_IMAGE_MAX_BYTES) {
      throw new ApiError('payload_too_large', `images[${i}] is larger than 5 MB.`);
    }
    const sniffed = sniffImage(bytes);
    if (!sniffed || sniffed !== declared) {
      throw new ApiError(
        'unsupported_media_type',
        sniffed
          ? `images[${i}] is ${sniffed}, not ${image.media_type}.`
          : `images[${i}] is not an image of ${AVATAR_TYPES.join(', ')}.`,
      );
    }
    return { mediaType: sniffed, data: bytes };
  });
}

/** What a turn is refused for, as the error the caller gets. */
function refusal(reason: conversations.TurnRefusal): ApiError {
  switch (reason) {
    case 'busy':
      return new ApiError('conversation_busy');
    case 'terminated':
      return new ApiError('conversation_terminated');
    case 'at_capacity':
      return new ApiError('sandbox_at_capacity', 'Another conversation on this sandbox is running a turn.');
    case 'missing':
      return new ApiError('not_found', 'Conversation not found.');
  }
}

/**
 * The runtime's environment for a turn: the environment's variables and secrets, then the
 * vault's (vault wins), then the model, system prompt, provider endpoint and credential the
 * way the runtime takes them (runtime-settings.ts: variables, command-line arguments, ACP
 * session fields or files in its HOME), and the service's address with a sandbox token of
 * the conversation. Every value is registered for redaction before anything can print it. A
 * token is minted per turn because the runtime that reads it may be a new one (after a
 * rebuild or a crash); they all end with the conversation.
 */
async function runtimeEnvironment(
  deps: LaunchDeps,
  accountId: string,
  conversationId: string,
  agent: AgentRow,
  environment: EnvironmentRow,
  vaultId: string | null,
  credential: { env: string; value: string } | undefined,
) {
  const env: Record<string, string> = {
    ...environment.env_vars,
    ...(await revealSecrets(deps, 'environment', accountId, environment.id)),
    ...(vaultId ? await revealSecrets(deps, 'vault', accountId, vaultId) : {}),
  };
  // The conversation's own token (actor `sprite`): what the runtime uses to reach the API,
  // for example to start a sub-conversation. Revoked when the conversation ends.
  const token = await issueSandboxToken(deps.sql, accountId, conversationId);
  const settings = runtimeSettings(
    { runtime: agent.runtime as Runtime, model: agent.model, system: agent.system },
    env,
    deps.providerUrls,
  );
  const runtimeEnv: Record<string, string> = {
    ...env,
    ...settings.env,
    SVC_API_URL: deps.apiUrl(),
    SVC_CONVERSATION_ID: conversationId,
    SVC_SANDBOX_TOKEN: token.key,
  };
  if (credential) runtimeEnv[credential.env] = credential.value;
  // What is secret or the tenant's own (DECISIONS: environment, vault, credential, token);
  // the service's address, the conversation's id, the model name and the instance's provider
  // endpoint are not.
  deps.redaction.register(accountId, conversationId, [
    ...Object.values(env),
    token.key,
    ...(credential ? [credential.value] : []),
  ]);
  return {
    env,
    runtimeEnv,
    args: settings.args,
    model: settings.sessionModel,
    sessionMeta: settings.sessionMeta,
    homeFiles: settings.homeFiles,
  };
}

/** What runs a turn on a sandbox once the records are written (in the background). */
interface TurnPlan {
  accountId: string;
  conversationId: string;
  sandbox: sandboxes.SandboxRow;
  /**
   * Build the machine first (a new sandbox, or a new incarnation of one that is gone), or, with
   * `adopt`, wake a suspended local sandbox: its runner-agent starts again on the kept directory.
   */
  build: {
    /** Wake: the runner adopts the directory as it is (stage `reattach`), nothing is built again. */
    adopt: boolean;
    env: Record<string, string>;
    setupScript: string | null;
    network: { allowed_hosts: string[] } | null;
    /** Repositories, packages and skills for stages `clone`, `packages` and `provision`. */
    stages: ReturnType<typeof buildStages>;
  } | null;
  turn: {
    id: string;
    prompt: string;
    images: { mediaType: string; data: Buffer }[];
    runtime: Runtime;
    env: Record<string, string>;
    /** Arguments after the runtime's configured command line (how some runtimes take their model and prompt). */
    args: string[];
    /** The model the runner selects in the runtime's ACP session, where the runtime needs that. */
    model: string | undefined;
    /** Which permission requests wait for an answer over the API (the agent's `permission_policy`). */
    permissionPolicy: { default: 'auto_allow' | 'ask'; ask: string[] };
    /** `_meta` for the runtime's session/new (the system prompt, for runtimes that take it there). */
    sessionMeta: Record<string, unknown> | undefined;
    /** Files for the runtime's HOME (the system prompt, for runtimes that read it from a file). */
    homeFiles: { path: string; content: string }[];
    /** The agent's MCP servers, for the runtime's ACP session. */
    mcpServers: { name: string; command: string; args: string[] }[];
  } | null;
}

/**
 * What a launch and a prompt both do once their records are written: the runtime's
 * environment is placed (and registered for redaction), then the build, when the machine
 * needs one, and the turn, when there is one, run on the sandbox in the background.
 */
async function runOnSandbox(
  deps: LaunchDeps,
  p: {
    accountId: string;
    conversationId: string;
    sandbox: sandboxes.SandboxRow;
    agent: AgentRow;
    environment: EnvironmentRow;
    vaultId: string | null;
    credential: { env: string; value: string } | undefined;
    build: boolean;
    /** The sandbox is suspended: wake it (its machine is kept, not built again). */
    wake: boolean;
    turn: { id: string; prompt: string; images: { mediaType: string; data: Buffer }[] } | null;
  },
): Promise<void> {
  const { agent, environment } = p;
  const { env, runtimeEnv, args, model, sessionMeta, homeFiles } = await runtimeEnvironment(
    deps,
    p.accountId,
    p.conversationId,
    agent,
    environment,
    p.vaultId,
    p.credential,
  );
  runTurn(deps, {
    accountId: p.accountId,
    conversationId: p.conversationId,
    sandbox: p.sandbox,
    build:
      p.build || p.wake
        ? {
            adopt: p.wake,
            env,
            setupScript: environment.setup_script || null,
            network: networkPolicy(deps, environment, agent),
            stages: buildStages(agent, environment),
          }
        : null,
    turn: p.turn
      ? {
          ...p.turn,
          runtime: agent.runtime as Runtime,
          env: runtimeEnv,
          args,
          model,
          permissionPolicy: policyOf(agent),
          sessionMeta,
          homeFiles,
          mcpServers: mcpServersOf(agent),
        }
      : null,
  });
}

/**
 * Gets the sandbox's machine running (for `local`, its own runner-agent child; for `runner`,
 * the runner already chosen), builds it when asked, then starts the turn. Every failure is
 * reported in the conversation's log and ends the turn `failed`, never left running.
 */
function runTurn(deps: LaunchDeps, plan: TurnPlan): void {
  const { accountId, conversationId, sandbox } = plan;
  const turnId = plan.turn?.id ?? null;
  const waking = plan.build?.adopt === true;
  void (async () => {
    // Stage `sandbox` opens here; the runner closes it when its build ends (done or failed).
    // A wake opens stage `reattach` instead, which the runner closes once it holds the kept
    // directory again (the sandbox is `ready` then).
    if (waking) {
      await emitStage(deps, accountId, {
        conversationId,
        turnId,
        stage: 'reattach',
        state: 'started',
        data: JSON.stringify({
          woken: true,
          reason: 'the sandbox was suspended',
          runtime_session: 'fresh: the runtime stopped with the suspended runner-agent',
        }),
      });
    } else if (plan.build) {
      await emitStage(deps, accountId, { conversationId, turnId, stage: 'sandbox', state: 'started' });
    }
    const provider = deps.providers.of(sandbox.provider);
    const onRunner = waking
      ? await provider.wake(sandbox)
      : plan.build
        ? await provider.create(sandbox)
        : await provider.adopt(sandbox);
    if (onRunner !== sandbox.runner_id) await sandboxes.setRunner(deps.sql, sandbox.id, onRunner);
    if (plan.build) {
      await deps.fabric.command(onRunner, {
        kind: 'sandbox.create',
        sandbox: sandbox.id,
        incarnation: sandbox.incarnation,
        conversation_id: conversationId,
        env: plan.build.env,
        setup_script: plan.build.setupScript,
        network: plan.build.network,
        ...plan.build.stages,
        ...(waking ? { adopt: true } : {}),
      });
    }
    if (plan.turn) {
      const { command, args } = commandLine(deps.runtimeCommands[plan.turn.runtime]);
      await deps.fabric.command(onRunner, {
        kind: 'turn.start',
        sandbox: sandbox.id,
        incarnation: sandbox.incarnation,
        conversation_id: conversationId,
        turn_id: plan.turn.id,
        prompt: plan.turn.prompt,
        runtime: {
          command,
          args: [...args, ...plan.turn.args],
          env: plan.turn.env,
          ...(plan.turn.model ? { model: plan.turn.model } : {}),
          ...(plan.turn.sessionMeta ? { session_meta: plan.turn.sessionMeta } : {}),
          ...(plan.turn.homeFiles.length ? { home_files: plan.turn.homeFiles } : {}),
        },
        time_limit_ms: deps.turnTimeLimitMs,
        permission_policy: plan.turn.permissionPolicy,
        permission_timeout_ms: deps.permissionTimeoutMs,
        mcp_servers: plan.turn.mcpServers,
        ...(plan.turn.images.length
          ? { images: plan.turn.images.map((i) => ({ data: i.data.toString('base64'), media_type: i.mediaType })) }
          : {}),
      });
    }
  })().catch(async (err: Error) => {
    deps.logger.warn({ err: { message: err.message }, conversation: conversationId }, 'turn could not start');
    await failLaunch(
      deps.sql,
      accountId,
      conversationId,
      plan.build ? sandbox.id : null,
      turnId,
      waking ? `the suspended sandbox could not be woken: ${err.message}` : err.message,
      waking ? 'reattach' : undefined,
    ).catch(() => {});
  });
}

/**
 * Whether the sandbox's machine can take a turn as it is, or must be built again first (its
 * machine failed or was destroyed, or is lost, as a local runner-agent after a restart), and
 * on which runner. 503 `runner_offline` when the machine is away and may come back.
 */
async function machineOf(deps: LaunchDeps, accountId: string, sandbox: sandboxes.SandboxRow) {
  const provider = deps.providers.of(sandbox.provider);
  const health = await provider.health(sandbox);
  // Reset (or retired): ready, but its incarnation has no machine yet.
  const unbuilt = sandbox.status === 'ready' && (sandbox.built_incarnation ?? -1) < sandbox.incarnation;
  // Suspended: its machine was stopped, its disk kept; it is woken, not built.
  const asleep = provider.suspends && sandbox.status === 'suspended';
  const gone =
    unbuilt || sandbox.status === 'failed' || sandbox.status === 'terminated' || (health === 'lost' && !asleep);
  let runnerId = sandbox.runner_id;
  if (health === 'away') {
    if (!gone) throw new ApiError('runner_offline', 'The runner this sandbox lives on is not connected.');
    runnerId = await provider.place(accountId);
  }
  return { gone, unbuilt, asleep, runnerId };
}

/**
 * Inside the transaction that starts a turn on a sandbox whose machine runs: whether it was
 * suspended since `machineOf` looked (the suspension locks the sandbox row; this waits for it
 * or comes first), so the turn wakes it instead of going to a runner-agent that is stopping.
 */
async function suspendedMeanwhile(
  tx: Sql,
  provider: SandboxProvider,
  sandbox: sandboxes.SandboxRow,
  machine: { gone: boolean; asleep: boolean },
): Promise<boolean> {
  if (!provider.suspends || machine.gone || machine.asleep) return false;
  return (await sandboxes.statusForShare(tx, sandbox.id)) === 'suspended';
}

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
 * conversation.
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
) {
  const { sql } = deps;
  if (who.actor === 'sprite') {
    if (parentId === null) {
      throw new ApiError('forbidden', 'A sandbox token starts only sub-conversations (X-Svc-Parent-Conversation-Id).');
    }
    if (parentId !== who.conversationId) {
      throw new ApiError('forbidden', 'A sandbox token starts sub-conversations only under its own conversation.');
    }
  }
  if (parentId !== null && !(await conversations.getConversation(sql, who.accountId, parentId))) {
    throw new ApiError('not_found', 'Parent conversation not found.');
  }
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
  if (input.images?.length && !input.prompt) {
    throw validationFailed({ images: ['come with a prompt'] });
  }
  const images = decodeImages(input.images);
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
  const machine = existing
    ? await machineOf(deps, who.accountId, existing)
    : {
        gone: true,
        unbuilt: false,
        asleep: false,
        runnerId: await provider.place(who.accountId),
      };

  const conversationId = newId('cnv');
  const turnId = input.prompt ? newId('trn') : null;
  const sandbox = await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    // A new machine, or one built again after it failed, counts against the quota and the fleet.
    if (!existing || existing.status === 'failed' || existing.status === 'terminated') {
      await checkCapacity(t, who.accountId, deps.limits);
    }
    let row: sandboxes.SandboxRow | undefined;
    if (existing && (await suspendedMeanwhile(t, deps.providers.of(existing.provider), existing, machine))) {
      machine.asleep = true;
      existing = { ...existing, status: 'suspended' };
    }
    if (existing) {
      // A wake is the sandbox's next incarnation too (its runner-agent numbers output afresh).
      row =
        machine.gone || machine.asleep
          ? await sandboxes.rebuild(
              t,
              existing.id,
              machine.asleep ? null : machine.runnerId,
              existing.status,
              !machine.unbuilt,
            )
          : existing;
      if (!row) throw new ApiError('provisioning', 'The sandbox is being built again; try again shortly.');
    } else {
      row = await sandboxes.insertSandbox(t, {
        id: newId('sbx'),
        accountId: who.accountId,
        provider: provider.name as sandboxes.SandboxRow['provider'],
        mode,
        runnerId: machine.runnerId,
        agentId: agent.id,
        environmentId,
        vaultId,
      });
      // Two persistent launches raced for one identity: the other one is building its machine.
      if (!row)
        throw new ApiError('provisioning', 'The agent’s machine for this environment and vault is being built.');
    }
    await conversations.insertConversation(t, {
      id: conversationId,
      accountId: who.accountId,
      agentId: agent.id,
      title: agent.name,
      source: parentId === null ? 'ui' : 'agent',
      parentId,
      environmentId,
      vaultId,
    });
    await conversations.setSandbox(t, who.accountId, conversationId, row.id);
    if (turnId && input.prompt) {
      const turn = await conversations.startTurn(t, {
        id: turnId,
        accountId: who.accountId,
        conversationId,
        prompt: input.prompt,
        origin: 'user',
        images,
        oneTurnPerSandbox: existing !== undefined && ONE_TURN_PER_SANDBOX.has(agent.runtime),
      });
      if (typeof turn === 'string') throw refusal(turn);
    }
    await outbox.enqueue(t, who.accountId, [changed('conversations')]);
    return row;
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
 * `POST /api/conversations/:id/prompts`: the next turn. Refused while a turn runs (400
 * `conversation_busy`), after the conversation ended (410), while another conversation runs
 * a turn on a one-turn sandbox (409 `sandbox_at_capacity`), and when its runner is away (503
 * `runner_offline`); nothing is recorded then. A sandbox whose machine is gone (failed,
 * terminated) is built again as its next incarnation for the same identity.
 */
export async function sendPrompt(
  deps: LaunchDeps,
  who: ActorRef,
  conversationId: string,
  input: { prompt: string; images?: { data: string; media_type: string }[] },
): Promise<conversations.TurnRow> {
  const { sql } = deps;
  const conv = await conversations.getConversation(sql, who.accountId, conversationId);
  if (!conv) throw new ApiError('not_found', 'Conversation not found.');
  if (conv.status === 'terminated') throw new ApiError('conversation_terminated');
  if (conv.status === 'running') throw new ApiError('conversation_busy');
  const agent = await agents.getAgent(sql, who.accountId, conv.agent_id);
  if (!agent) throw new ApiError('not_found', 'The conversation’s agent was deleted.');
  const environment = await environments.getEnvironment(
    sql,
    who.accountId,
    conv.environment_id ?? agent.environment_id,
  );
  if (!environment) throw new ApiError('not_found', 'The conversation’s environment was deleted.');
  const images = decodeImages(input.images);
  const credential = await findCredential(deps, who.accountId, agent.runtime as Runtime, agent.model);

  let sandbox = conv.sandbox_id ? await sandboxes.getSandbox(sql, who.accountId, conv.sandbox_id) : undefined;
  if (!sandbox) throw new ApiError('not_found', 'The conversation has no sandbox.');
  const machine = await machineOf(deps, who.accountId, sandbox);
  const { gone, unbuilt, runnerId } = machine;

  const turnId = newId('trn');
  const turn = await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    const opened = await conversations.startTurn(t, {
      id: turnId,
      accountId: who.accountId,
      conversationId,
      prompt: input.prompt,
      origin: 'user',
      images,
      oneTurnPerSandbox: ONE_TURN_PER_SANDBOX.has(agent.runtime),
    });
    if (typeof opened === 'string') throw refusal(opened);
    if (sandbox && (await suspendedMeanwhile(t, deps.providers.of(sandbox.provider), sandbox, machine))) {
      machine.asleep = true;
      sandbox = { ...sandbox, status: 'suspended' };
    }
    if ((gone || machine.asleep) && sandbox) {
      // A wake is the sandbox's next incarnation too (its runner-agent numbers output afresh).
      const rebuilt = await sandboxes.rebuild(
        t,
        sandbox.id,
        machine.asleep ? null : runnerId,
        sandbox.status,
        !unbuilt,
      );
      if (!rebuilt) throw new ApiError('conversation_busy', 'The sandbox is being rebuilt; try again.');
      sandbox = rebuilt;
    }
    await outbox.enqueue(t, who.accountId, [changed('conversations')]);
    return opened;
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
    build: gone,
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
    await deps.relay.flush(who.accountId);
  }
  await recordAudit(sql, who, 'conversation.interrupted', { type: 'conversation', id: conversationId });
  return (await conversations.getConversation(sql, who.accountId, conversationId)) ?? conv;
}

/**
 * `POST /api/conversations/:id/terminate`: the conversation ends (410 afterwards), a running
 * turn ends `interrupted`, its runtime stops, and its sandbox is destroyed unless it is
 * persistent or another live conversation shares it.
 */
export async function terminateConversation(deps: LaunchDeps, who: ActorRef, conversationId: string) {
  const { sql } = deps;
  const ended = await conversations.terminate(sql, who.accountId, conversationId, (turnId) => [
    ...(turnId ? [turnEndEvent(conversationId, turnId, 'interrupted', 'the conversation was terminated')] : []),
    { conversationId, turnId: null, kind: 'stage', stream: 'stage', stage: 'terminate', state: 'done' },
    changed('conversations'),
  ]);
  if (!ended) {
    const exists = await conversations.getConversation(sql, who.accountId, conversationId);
    throw exists ? new ApiError('conversation_terminated') : new ApiError('not_found', 'Conversation not found.');
  }
  if (ended.interruptedTurnId) await resolveRequestsOfTurn(sql, who.accountId, ended.interruptedTurnId);
  await deps.relay.flush(who.accountId);
  await credentials.revokeSandboxTokens(sql, who.accountId, conversationId);
  await recordAudit(sql, who, 'conversation.terminated', { type: 'conversation', id: conversationId });
  const sandbox = ended.sandboxId ? await sandboxes.getSandbox(sql, who.accountId, ended.sandboxId) : undefined;
  if (sandbox) {
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
  return (await conversations.getConversation(sql, who.accountId, conversationId)) as conversations.ConversationRow;
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

/** The `turn` stage event that ends a turn the service ended itself. */
function turnEndEvent(conversationId: string, turnId: string, state: string, error: string) {
  return {
    conversationId,
    turnId,
    kind: 'stage',
    stream: 'stage',
    stage: 'turn',
    state,
    data: JSON.stringify({ usage: null, error }),
  };
}

async function findCredential(deps: LaunchDeps, accountId: string, runtime: Runtime, model: string) {
  const choices = credentialsFor(runtime, providerOf(model) ?? '');
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
  e: {
    conversationId: string;
    turnId: string | null;
    stage: string;
    state: string;
    durationMs?: number;
    data?: string;
  },
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
        ...(e.data !== undefined ? { data: e.data } : {}),
      },
    ]),
  );
  await deps.relay.flush(accountId);
}

/**
 * The launch or turn could not start after the answer: say so in the log, end the turn
 * `failed`, and fail the sandbox whose build it was.
 */
async function failLaunch(
  sql: Sql,
  accountId: string,
  conversationId: string,
  sandboxId: string | null,
  turnId: string | null,
  message: string,
  /** The stage that failed, when it is not the build's (`sandbox`) or the turn's: `reattach` for a wake. */
  stage?: string,
) {
  if (sandboxId) await sandboxes.moveStatus(sql, sandboxId, ['provisioning'], 'failed');
  await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    await outbox.enqueue(t, accountId, [
      {
        conversationId,
        turnId,
        kind: 'stage',
        stream: 'stage',
        stage: stage ?? (sandboxId ? 'sandbox' : 'turn'),
        state: 'failed',
        data: message,
      },
      // A failed wake also says, in the turn's own terms, that the turn did not run.
      ...(stage && turnId ? [turnEndEvent(conversationId, turnId, 'failed', message)] : []),
    ]);
  });
  if (turnId && (await conversations.endTurn(sql, accountId, turnId, 'failed', null, [changed('conversations')]))) {
    await recordAudit(
      sql,
      { accountId, actor: 'system', ip: null },
      'turn.ended',
      { type: 'turn', id: turnId },
      { state: 'failed', reason: 'launch_failed' },
    );
  }
}
