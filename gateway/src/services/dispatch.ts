import {
  ApiError,
  type BrokerBinding,
  commandLine,
  type McpHttpServer,
  type McpServerEntry,
  type McpStdioServer,
  type Runtime,
} from '@svc/core';
import { outbox, type Sql, type sandboxes } from '@svc/db';
import type { LaunchDeps } from './launch-deps.ts';
import { machineRunner } from './machine.ts';
import {
  type AgentRow,
  alwaysReached,
  buildStages,
  type EnvironmentRow,
  mcpServersOf,
  networkPolicy,
  policyOf,
  runtimeEnvironment,
} from './runtime-env.ts';
import { failTurnStart } from './turns.ts';

/*
 * Dispatch to the runner: once a launch or a prompt has written its records, the sandbox's
 * machine is had from its provider and told what to build (`sandbox.create`) and what to run
 * (`turn.start`) over the runner fabric, in the background. Whatever fails after the answer is
 * said in the conversation's log and ends the turn (turns.ts), never left running.
 */

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
    /** The hosts its runtimes always reach (the model provider's, the service's). */
    reach: string[];
    /** The build's bound secrets (the setup script's placeholders); absent while the broker is off. */
    broker: BrokerBinding[] | undefined;
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
    /** The runtime's MCP servers (the agent's, and the team's on a team conversation), for its ACP session. */
    mcpServers: McpServerEntry[];
    /** The turn's bound secrets and inference credential for the broker; absent while it is off. */
    broker: BrokerBinding[] | undefined;
  } | null;
}

/**
 * What a launch and a prompt both do once their records are written: the runtime's
 * environment is placed (and registered for redaction), then the build, when the machine
 * needs one, and the turn, when there is one, run on the sandbox in the background.
 */
export async function runOnSandbox(
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
  const { env, runtimeEnv, token, args, model, sessionMeta, homeFiles, broker } = await runtimeEnvironment(
    deps,
    p.accountId,
    p.conversationId,
    agent,
    environment,
    p.vaultId,
    p.credential,
  );
  const mcpServers = p.turn ? await mcpServersOf(deps, p.accountId, p.conversationId, agent, token) : [];
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
            reach: alwaysReached(deps, agent),
            broker,
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
          mcpServers,
          broker,
        }
      : null,
  });
}

/**
 * Gets the sandbox's machine running (from its provider: see machineRunner), builds it when
 * asked, then starts the turn. Every failure is reported in the conversation's log and ends
 * the turn `failed`, never left running.
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
    const onRunner = await machineRunner(deps, sandbox, waking ? 'wake' : plan.build ? 'create' : 'adopt');
    if (plan.build) {
      await deps.fabric.command(onRunner, {
        kind: 'sandbox.create',
        sandbox: sandbox.id,
        incarnation: sandbox.incarnation,
        conversation_id: conversationId,
        env: plan.build.env,
        setup_script: plan.build.setupScript,
        network: plan.build.network,
        reach: plan.build.reach,
        ...(plan.build.broker ? { broker: plan.build.broker } : {}),
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
        ...(plan.turn.broker ? { broker: plan.turn.broker } : {}),
        runtime: {
          command,
          args: [...args, ...plan.turn.args],
          name: plan.turn.runtime,
          settings_args: plan.turn.args,
          env: plan.turn.env,
          ...(plan.turn.model ? { model: plan.turn.model } : {}),
          ...(plan.turn.sessionMeta ? { session_meta: plan.turn.sessionMeta } : {}),
          ...(plan.turn.homeFiles.length ? { home_files: plan.turn.homeFiles } : {}),
        },
        time_limit_ms: deps.turnTimeLimitMs,
        permission_policy: plan.turn.permissionPolicy,
        permission_timeout_ms: deps.permissionTimeoutMs,
        autonomous_idle_ms: deps.autonomousIdleMs,
        mcp_servers: plan.turn.mcpServers.filter((m): m is McpStdioServer => !('type' in m)),
        mcp_http_servers: plan.turn.mcpServers.filter((m): m is McpHttpServer => 'type' in m),
        ...(plan.turn.images.length
          ? { images: plan.turn.images.map((i) => ({ data: i.data.toString('base64'), media_type: i.mediaType })) }
          : {}),
      });
    }
  })().catch(async (err: Error) => {
    deps.logger.warn({ err: { message: err.message }, conversation: conversationId }, 'turn could not start');
    await failTurnStart(
      deps.sql,
      accountId,
      conversationId,
      plan.build ? sandbox.id : null,
      turnId,
      {
        // A runner that is away is the machine's failure; anything else kept the sandbox from serving.
        code:
          err instanceof ApiError && (err.code === 'runner_offline' || err.code === 'no_runner_online')
            ? 'runner_offline'
            : 'sandbox_failed',
        message: waking ? `the suspended sandbox could not be woken: ${err.message}` : err.message,
      },
      waking ? 'reattach' : undefined,
    ).catch(() => {});
  });
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
