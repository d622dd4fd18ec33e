import {
  ApiError,
  type McpServerEntry,
  Packages,
  providerOf,
  type Runtime,
  type SandboxCreateCommand,
  TEAM_CHANNEL,
} from '@svc/core';
import { type agents, conversations, type environments } from '@svc/db';
import { issueSandboxToken } from './credentials.ts';
import { revealCredential } from './inference-credentials.ts';
import type { LaunchDeps } from './launch.ts';
import { credentialsFor, runtimeSettings } from './runtime-settings.ts';
import { revealSecrets } from './secrets.ts';
import { TEAM_MCP_SERVER } from './team-mcp.ts';

/*
 * The runtime environment of a sandbox and its turns: what the machine is built with (the
 * environment's variables, setup, egress policy, repositories, packages, skills) and what the
 * runtime is started with (variables, arguments, credential, session settings), every secret
 * value registered for redaction before anything can print it.
 */

/**
 * A sandbox's egress policy (DECISIONS: `allowed_hosts` is enforced by the runner): null for an
 * environment without `networking_config` (unrestricted); otherwise its allowlist plus the
 * host of the agent's model provider and of the service itself (SVC_API_URL, which the runtime
 * calls for sub-conversations), so a list, even empty, never cuts the runtime off from either.
 */
export function networkPolicy(deps: LaunchDeps, environment: EnvironmentRow, agent: AgentRow) {
  if (!environment.networking_config) return null;
  return {
    allowed_hosts: [...new Set([...environment.networking_config.allowed_hosts, ...alwaysReached(deps, agent)])],
  };
}

/**
 * The hosts a sandbox's runtime reaches whatever its policy (`host:port` when the URL names a
 * port): its model provider's and the service's own. The runner bridges them into an isolated
 * sandbox, also when they are on its loopback.
 */
export function alwaysReached(deps: LaunchDeps, agent: AgentRow): string[] {
  const urls = [deps.providerUrls[providerOf(agent.model) ?? ''], deps.apiUrl()];
  return [...new Set(urls.flatMap((u) => (u ? [hostPort(new URL(u))] : [])))];
}

/** `host:port` of a URL, its scheme's default port written out (a bridge needs the port). */
function hostPort(url: URL): string {
  return url.port ? url.host : `${url.host}:${url.protocol === 'https:' ? 443 : 80}`;
}

export type AgentRow = NonNullable<Awaited<ReturnType<typeof agents.getAgent>>>;
export type EnvironmentRow = NonNullable<Awaited<ReturnType<typeof environments.getEnvironment>>>;

export function policyOf(agent: AgentRow) {
  return agent.permission_policy as { default: 'auto_allow' | 'ask'; ask: string[] };
}

/** What the runner builds besides the directory: the environment's repositories and packages, the agent's skills. */
export function buildStages(agent: AgentRow, environment: EnvironmentRow) {
  const packages = Packages.safeParse(environment.packages);
  return {
    repositories: environment.repositories,
    packages: packages.success ? { apt: packages.data.apt ?? [], npm: packages.data.npm ?? [] } : {},
    skills: agent.skills as SandboxCreateCommand['skills'],
  };
}

/**
 * The MCP servers of a turn's runtime: the agent's own (stdio), and on a conversation of the
 * team channel the service's team server `svc-team` (HTTP, SPEC Team rule 7), authenticated
 * with the conversation's sandbox `token`. An agent server of that name gives way to it.
 */
export async function mcpServersOf(
  deps: Pick<LaunchDeps, 'sql' | 'apiUrl'>,
  accountId: string,
  conversationId: string,
  agent: AgentRow,
  token: string,
): Promise<McpServerEntry[]> {
  const own = Object.entries(agent.mcp_servers).map(([name, m]) => ({ name, command: m.command, args: m.args ?? [] }));
  const conv = await conversations.getConversation(deps.sql, accountId, conversationId);
  if (conv?.channel_id !== TEAM_CHANNEL) return own;
  return [
    ...own.filter((m) => m.name !== TEAM_MCP_SERVER),
    {
      type: 'http',
      name: TEAM_MCP_SERVER,
      url: `${deps.apiUrl()}/api/mcp/team/${conversationId}`,
      headers: [{ name: 'Authorization', value: `Bearer ${token}` }],
    },
  ];
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
export async function runtimeEnvironment(
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
  await deps.redaction.register(accountId, conversationId, [
    ...Object.values(env),
    token.key,
    ...(credential ? [credential.value] : []),
  ]);
  return {
    env,
    runtimeEnv,
    /** The conversation's sandbox token of this turn (also in `runtimeEnv`), for its MCP servers. */
    token: token.key,
    args: settings.args,
    model: settings.sessionModel,
    sessionMeta: settings.sessionMeta,
    homeFiles: settings.homeFiles,
  };
}

export async function findCredential(deps: LaunchDeps, accountId: string, runtime: Runtime, model: string) {
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
