import { randomBytes } from 'node:crypto';
import {
  ApiError,
  type BindingShape,
  type BrokerBinding,
  bindingHeader,
  type McpServerEntry,
  Packages,
  providerOf,
  type Runtime,
  type SandboxCreateCommand,
  TEAM_CHANNEL,
} from '@svc/core';
import { type agents, conversations, type environments, secretBindings } from '@svc/db';
import { issueSandboxToken } from './credentials.ts';
import { revealCredential } from './inference-credentials.ts';
import type { LaunchDeps } from './launch-deps.ts';
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
  const secrets: Record<string, string> = {
    ...(await revealSecrets(deps, 'environment', accountId, environment.id)),
    ...(vaultId ? await revealSecrets(deps, 'vault', accountId, vaultId) : {}),
  };
  const env: Record<string, string> = { ...environment.env_vars, ...secrets };
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
  const brokered = deps.broker
    ? await broker(deps, accountId, { secrets, credential, providerUrl: providerUrlOf(agent, runtimeEnv, deps) })
    : undefined;
  // What is secret or the tenant's own (DECISIONS: environment, vault, credential, token);
  // the service's address, the conversation's id, the model name and the instance's provider
  // endpoint are not.
  await deps.redaction.register(accountId, conversationId, [
    ...Object.values(env),
    token.key,
    ...(credential ? [credential.value] : []),
    // A placeholder stands for a secret: it reads as one in the log too.
    ...(brokered?.bindings.map((b) => b.placeholder) ?? []),
  ]);
  // Brokered, the sandbox sees placeholders where the bound values were, in every form the
  // runtime is given them (variables, arguments, session fields, files in its HOME).
  const swap = brokered ? placeholders(brokered.bindings) : (text: string) => text;
  const swapAll = (record: Record<string, string>) =>
    Object.fromEntries(Object.entries(record).map(([k, v]) => [k, swap(v)]));
  return {
    env: swapAll(env),
    runtimeEnv: swapAll(runtimeEnv),
    /** The bound secrets the runner's broker writes for their hosts; absent while it is off. */
    broker: brokered?.bindings.map(({ real: _real, ...binding }) => binding),
    /** The conversation's sandbox token of this turn (also in `runtimeEnv`), for its MCP servers. */
    token: token.key,
    args: settings.args.map(swap),
    model: settings.sessionModel,
    sessionMeta: settings.sessionMeta
      ? (JSON.parse(swap(JSON.stringify(settings.sessionMeta))) as typeof settings.sessionMeta)
      : settings.sessionMeta,
    homeFiles: settings.homeFiles.map((f) => ({ ...f, content: swap(f.content) })),
  };
}

/**
 * How each inference credential's variable reaches its provider's API, as the runtimes' clients
 * send it: the header the broker writes the credential into.
 */
const CREDENTIAL_HEADERS: Record<string, { header: string; format: string }> = {
  ANTHROPIC_API_KEY: { header: 'x-api-key', format: '{value}' },
  CLAUDE_CODE_OAUTH_TOKEN: { header: 'authorization', format: 'Bearer {value}' },
  OPENAI_API_KEY: { header: 'authorization', format: 'Bearer {value}' },
  GEMINI_API_KEY: { header: 'x-goog-api-key', format: '{value}' },
};

/** The variables of the provider's base URL the runtimes read, by provider. */
const BASE_URL_VARIABLES: Record<string, string> = {
  anthropic: 'ANTHROPIC_BASE_URL',
  openai: 'OPENAI_BASE_URL',
  google: 'GOOGLE_GEMINI_BASE_URL',
};

/** The model provider's URL as the runtime calls it: its environment's base URL, else the instance's. */
function providerUrlOf(agent: AgentRow, runtimeEnv: Record<string, string>, deps: LaunchDeps): string | undefined {
  const provider = providerOf(agent.model) ?? '';
  return runtimeEnv[BASE_URL_VARIABLES[provider] ?? ''] || deps.providerUrls[provider];
}

/** A placeholder: what a sandbox holds instead of a bound value (DECISIONS: `svc-placeholder-<random>`). */
const newPlaceholder = () => `svc-placeholder-${randomBytes(18).toString('base64url')}`;

/**
 * The broker's bindings of a turn (DECISIONS "Sandboxes that hold"): every secret of the
 * environment and vault whose name the account binds gets one placeholder, and a binding per
 * host it is bound to; the inference credential gets one for its provider's host. The runner
 * receives the values (it writes them into requests); the sandbox, the placeholders only.
 */
async function broker(
  deps: LaunchDeps,
  accountId: string,
  input: {
    secrets: Record<string, string>;
    credential: { env: string; value: string } | undefined;
    providerUrl: string | undefined;
  },
): Promise<{ bindings: (BrokerBinding & { real: string })[] }> {
  const bindings: (BrokerBinding & { real: string })[] = [];
  const rows = await secretBindings.bindingsForSecrets(deps.sql, accountId, Object.keys(input.secrets));
  const placeholderOf = new Map<string, string>();
  for (const row of rows) {
    const real = input.secrets[row.secret_name];
    if (real === undefined) continue;
    const placeholder = placeholderOf.get(row.secret_name) ?? newPlaceholder();
    placeholderOf.set(row.secret_name, placeholder);
    const header = bindingHeader(row.shape as BindingShape, real);
    bindings.push({ binding_id: row.id, placeholder, host: row.host, header: header.name, value: header.value, real });
  }
  const { credential, providerUrl } = input;
  const shape = credential ? CREDENTIAL_HEADERS[credential.env] : undefined;
  if (credential && shape && providerUrl) {
    const url = new URL(providerUrl);
    const host = url.port ? url.host : `${url.host}:${url.protocol === 'https:' ? 443 : 80}`;
    const header = bindingHeader(shape, credential.value);
    bindings.push({
      binding_id: null,
      placeholder: newPlaceholder(),
      host,
      header: header.name,
      value: header.value,
      real: credential.value,
    });
  }
  return { bindings };
}

/** Replaces each bound value by its placeholder, longest value first (one may hold another). */
function placeholders(bindings: readonly { placeholder: string; real: string }[]): (text: string) => string {
  const pairs = [...new Map(bindings.map((b) => [b.real, b.placeholder])).entries()]
    .filter(([real]) => real.length > 0)
    .sort((a, b) => b[0].length - a[0].length);
  return (text) => pairs.reduce((out, [real, placeholder]) => out.split(real).join(placeholder), text);
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
