import { providerOf, type Runtime, runtimeModel } from '@svc/core';

/** The credential each model provider's runtime reads, in the order they are tried. */
export const CREDENTIALS: Record<
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

/**
 * Where each model provider's API is for the runtimes: the variable the runtimes' clients read
 * (a sandbox's environment or vault may set it to name its own endpoint), and what follows the
 * instance's base URL (`*_BASE_URL` configuration, which names the host the way the
 * credential check uses it) in that variable: OpenAI's clients expect the `/v1` in it.
 */
const BASE_URLS: Record<string, { env: string; path: string }> = {
  anthropic: { env: 'ANTHROPIC_BASE_URL', path: '' },
  openai: { env: 'OPENAI_BASE_URL', path: '/v1' },
  google: { env: 'GOOGLE_GEMINI_BASE_URL', path: '' },
};

/** What a runtime's turn needs to know of its agent. */
export interface RuntimeAgent {
  runtime: Runtime;
  /** `provider/model_id`. */
  model: string;
  /** The agent's system prompt (may be empty). */
  system: string;
}

/** How the agent's model, system prompt and provider reach one runtime's ACP agent. */
export interface RuntimeSettings {
  /** Variables added to the runtime's environment (after the sandbox's own). */
  env: Record<string, string>;
  /** Arguments appended to the runtime's configured command line (RUNTIME_<NAME>_COMMAND). */
  args: string[];
  /** The model the runner selects in the ACP session, for runtimes that need that. */
  sessionModel: string | undefined;
  /** `_meta` of the runtime's `session/new`, for runtimes that take the system prompt there. */
  sessionMeta: Record<string, unknown> | undefined;
}

/** A TOML basic string (Codex parses each `-c key=value` value as TOML). */
export function tomlString(text: string): string {
  // JSON's escapes are TOML's, except that TOML wants DEL escaped and has no lone surrogates.
  const wellFormed = text.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');
  return JSON.stringify(wellFormed).replace(/\u007f/g, '\\u007f');
}

/** The id of the model provider the service defines for Codex (see `codex` below). */
const CODEX_PROVIDER = 'svc_openai';

/**
 * How each runtime takes the agent's model, system prompt and provider endpoint, given the
 * model as the runtime names it and the provider's base URL (the sandbox's own, else the
 * instance's). The credential goes in the variable of CREDENTIALS.
 */
const RUNTIMES: Record<
  Runtime,
  (p: { model: string; system: string; baseUrl: string | undefined }) => Omit<RuntimeSettings, 'env'> & {
    env?: Record<string, string>;
  }
> = {
  /**
   * Tested with the real claude-agent-acp (test/src/launch-claude.test.ts). Claude Code lists
   * the model named by ANTHROPIC_MODEL among the session's model choices, and claude-agent-acp
   * opens every session on its first choice ("default") whatever the environment says, so the
   * runner also selects it in the session. The system prompt goes in `_meta.systemPrompt` of
   * `session/new`; `{append}` keeps Claude Code's own prompt, which its tools rely on.
   */
  claude: ({ model, system }) => ({
    env: { ANTHROPIC_MODEL: model },
    args: [],
    sessionModel: model,
    sessionMeta: system.trim() ? { systemPrompt: { append: system } } : undefined,
  }),
  /**
   * Tested with the real codex-acp 0.16.0 (test/src/launch-codex.test.ts). codex-acp takes
   * Codex configuration as `-c key=value` arguments (values in TOML) and ignores `_meta`.
   * Codex's built-in `openai` provider reads its key only from a login (`auth.json`, which
   * codex-acp writes on ACP `authenticate`) and refuses `session/new` without one, so the
   * service defines a provider of its own that is the same OpenAI Responses API but reads the
   * key from OPENAI_API_KEY on every request (`env_key`) at the base URL given here. The
   * system prompt is `developer_instructions`: sent as a developer message after Codex's own
   * instructions, which its tools rely on.
   */
  codex: ({ model, system, baseUrl }) => {
    const config: [string, string][] = [
      ['model_provider', tomlString(CODEX_PROVIDER)],
      [`model_providers.${CODEX_PROVIDER}.name`, tomlString('OpenAI')],
      [`model_providers.${CODEX_PROVIDER}.env_key`, tomlString('OPENAI_API_KEY')],
      [`model_providers.${CODEX_PROVIDER}.wire_api`, tomlString('responses')],
      ...(baseUrl ? [[`model_providers.${CODEX_PROVIDER}.base_url`, tomlString(baseUrl)] as [string, string]] : []),
      ['model', tomlString(model)],
      ...(system.trim() ? [['developer_instructions', tomlString(system)] as [string, string]] : []),
    ];
    return {
      args: config.flatMap(([key, value]) => ['-c', `${key}=${value}`]),
      sessionModel: undefined,
      sessionMeta: undefined,
    };
  },
  /** Gemini CLI reads GEMINI_MODEL (its documented variable; not tested with the real CLI here). */
  gemini: ({ model }) => ({ env: { GEMINI_MODEL: model }, args: [], sessionModel: undefined, sessionMeta: undefined }),
  /** opencode gets no model or system prompt yet. */
  opencode: () => ({ args: [], sessionModel: undefined, sessionMeta: undefined }),
};

/**
 * What the runtime of `agent` gets besides the sandbox's variables and the credential: its
 * model and system prompt the way it takes them, and the provider's base URL, which is the
 * sandbox's own variable when its environment or vault sets one, else the instance's
 * (`providerUrls`, the endpoint the credential was checked against and an egress allowlist
 * always opens). `sandboxEnv` is the sandbox's environment and vault variables, merged.
 */
export function runtimeSettings(
  agent: RuntimeAgent,
  sandboxEnv: Record<string, string>,
  providerUrls: Record<string, string>,
): RuntimeSettings {
  const provider = providerOf(agent.model) ?? '';
  const where = BASE_URLS[provider];
  const instanceUrl = providerUrls[provider];
  const baseUrl = where
    ? (sandboxEnv[where.env] ?? (instanceUrl ? instanceUrl.replace(/\/+$/, '') + where.path : undefined))
    : undefined;
  const settings = RUNTIMES[agent.runtime]({
    model: runtimeModel(agent.runtime, agent.model),
    system: agent.system,
    baseUrl,
  });
  return {
    ...settings,
    env: { ...(where && baseUrl ? { [where.env]: baseUrl } : {}), ...settings.env },
  };
}
