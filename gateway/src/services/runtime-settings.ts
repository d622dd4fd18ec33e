import { providerOf, type Runtime, runtimeModel } from '@svc/core';

/** The credential each model provider's runtimes read, in the order they are tried. */
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

/**
 * The credentials `runtime` can use for the models of `provider`, in the order they are tried;
 * undefined for a provider whose runtime reads its own configuration (opencode's others).
 * opencode reads no Claude Code OAuth token: it needs an Anthropic API key.
 */
export function credentialsFor(runtime: Runtime, provider: string) {
  const choices = CREDENTIALS[provider];
  return runtime === 'opencode' ? choices?.filter((c) => c.provider !== 'claude_code_oauth_token') : choices;
}

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
  /** Files the runner writes into the runtime's HOME (the sandbox) before it starts. */
  homeFiles: { path: string; content: string }[];
}

/** Where the runner writes the agent's system prompt for runtimes that read it from a file (under HOME). */
const SYSTEM_PROMPT_FILE = '.svc/system-prompt.md';

/** A TOML basic string (Codex parses each `-c key=value` value as TOML). */
function tomlString(text: string): string {
  // JSON's escapes are TOML's, except that TOML wants DEL escaped and has no lone surrogates.
  const wellFormed = text.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');
  return JSON.stringify(wellFormed).replace(/\u007f/g, '\\u007f');
}

/**
 * How often a runtime retries a failed call to its provider, where it lets us say so. Their own
 * defaults (Claude Code 10, with backoff) keep a turn with a wrong key or an unreachable
 * provider `running` and silent for minutes; a few retries still ride out a passing 429 or 529.
 * A sandbox that sets the runtime's own variable keeps its value.
 */
const PROVIDER_MAX_RETRIES = 2;

/** The id of the model provider the service defines for Codex (see `codex` below). */
const CODEX_PROVIDER = 'svc_openai';

/**
 * What a runtime's way is given: the model as the runtime names it, the agent's system
 * prompt, the provider's base URL (the sandbox's own, else the instance's) and the sandbox's
 * variables.
 */
interface RuntimeInput {
  model: string;
  system: string;
  baseUrl: string | undefined;
  sandboxEnv: Record<string, string>;
}

/** How one runtime takes the model, system prompt and endpoint (the base URL variable is added for all). */
type RuntimeWay = (p: RuntimeInput) => Omit<RuntimeSettings, 'env'> & { env?: Record<string, string> };

/** Each runtime's way. The credential goes in its variable of CREDENTIALS (credentialsFor). */
const RUNTIMES: Record<Runtime, RuntimeWay> = {
  /**
   * Tested with the real claude-agent-acp (test/src/launch-claude.test.ts). Claude Code lists
   * the model named by ANTHROPIC_MODEL among the session's model choices, and claude-agent-acp
   * opens every session on its first choice ("default") whatever the environment says, so the
   * runner also selects it in the session. The system prompt goes in `_meta.systemPrompt` of
   * `session/new`; `{append}` keeps Claude Code's own prompt, which its tools rely on. Its
   * retries of a failed API call are CLAUDE_CODE_MAX_RETRIES (a 401 is retried like a 5xx).
   */
  claude: ({ model, system, sandboxEnv }) => ({
    env: {
      ANTHROPIC_MODEL: model,
      CLAUDE_CODE_MAX_RETRIES: sandboxEnv.CLAUDE_CODE_MAX_RETRIES || String(PROVIDER_MAX_RETRIES),
    },
    args: [],
    sessionModel: model,
    sessionMeta: system.trim() ? { systemPrompt: { append: system } } : undefined,
    homeFiles: [],
  }),
  /**
   * Tested with the real codex-acp 0.16.0 (test/src/launch-codex.test.ts). codex-acp takes
   * Codex configuration as `-c key=value` arguments (values in TOML) and ignores `_meta`.
   * Codex's built-in `openai` provider reads its key only from a login (`auth.json`, which
   * codex-acp writes on ACP `authenticate`) and refuses `session/new` without one, so the
   * service defines a provider of its own that is the same OpenAI Responses API but reads the
   * key from OPENAI_API_KEY on every request (`env_key`) at the base URL given here. The
   * system prompt is `developer_instructions`: sent as a developer message after Codex's own
   * instructions, which its tools rely on. The provider's `request_max_retries` and
   * `stream_max_retries` bound its retries.
   */
  codex: ({ model, system, baseUrl }) => {
    const config: [string, string][] = [
      ['model_provider', tomlString(CODEX_PROVIDER)],
      [`model_providers.${CODEX_PROVIDER}.name`, tomlString('OpenAI')],
      [`model_providers.${CODEX_PROVIDER}.env_key`, tomlString('OPENAI_API_KEY')],
      [`model_providers.${CODEX_PROVIDER}.wire_api`, tomlString('responses')],
      [`model_providers.${CODEX_PROVIDER}.request_max_retries`, String(PROVIDER_MAX_RETRIES)],
      [`model_providers.${CODEX_PROVIDER}.stream_max_retries`, String(PROVIDER_MAX_RETRIES)],
      ...(baseUrl ? [[`model_providers.${CODEX_PROVIDER}.base_url`, tomlString(baseUrl)] as [string, string]] : []),
      ['model', tomlString(model)],
      ...(system.trim() ? [['developer_instructions', tomlString(system)] as [string, string]] : []),
    ];
    return {
      args: config.flatMap(([key, value]) => ['-c', `${key}=${value}`]),
      sessionModel: undefined,
      sessionMeta: undefined,
      homeFiles: [],
    };
  },
  /**
   * Tested with the real Gemini CLI 0.61.0 (test/src/launch-gemini.test.ts). Gemini CLI reads
   * its model from GEMINI_MODEL and its key from GEMINI_API_KEY; with GOOGLE_GEMINI_BASE_URL set
   * it authenticates as a gateway with that key at that URL, without an ACP `authenticate`. Its
   * system prompt can only be replaced (GEMINI_SYSTEM_MD), not added to, so the agent's system
   * prompt goes where Gemini CLI reads the user's own instructions, the global context file
   * `~/.gemini/GEMINI.md` (HOME is the sandbox), which it adds after its own prompt.
   */
  gemini: ({ model, system }) => ({
    env: { GEMINI_MODEL: model },
    args: [],
    sessionModel: undefined,
    sessionMeta: undefined,
    homeFiles: system.trim() ? [{ path: '.gemini/GEMINI.md', content: system }] : [],
  }),
  /**
   * Tested with the real opencode 1.18.33 (test/src/launch-opencode.test.ts). opencode reads a
   * whole configuration, merged over its files, from OPENCODE_CONFIG_CONTENT: the model is
   * `provider/model_id` there, and the endpoint the provider's `options.baseURL` (in the form of
   * the AI SDK provider it uses, which has the API version in it). The key is the provider's
   * usual variable, which opencode reads itself (OPENAI_API_KEY, ANTHROPIC_API_KEY,
   * GEMINI_API_KEY). The system prompt is a file named in `instructions` (opencode takes
   * instructions only from files and URLs), which opencode adds after its own prompt, as it
   * does AGENTS.md; `~/` is HOME, the sandbox. A configuration the sandbox sets in
   * OPENCODE_CONFIG_CONTENT is kept: the model, endpoint and file are laid over it.
   */
  opencode: ({ model, system, baseUrl, sandboxEnv }) => {
    const provider = providerOf(model) ?? '';
    const base = sandboxEnv.OPENCODE_CONFIG_CONTENT ? parseObject(sandboxEnv.OPENCODE_CONFIG_CONTENT) : {};
    const providers = objectOf(base.provider);
    const own = objectOf(providers[provider]);
    const sdkUrl = baseUrl && provider in OPENCODE_API_PATH ? baseUrl + OPENCODE_API_PATH[provider] : undefined;
    const prompt = system.trim() ? [{ path: SYSTEM_PROMPT_FILE, content: system }] : [];
    const instructions = Array.isArray(base.instructions) ? base.instructions : [];
    const config = {
      ...base,
      model,
      ...(sdkUrl
        ? { provider: { ...providers, [provider]: { ...own, options: { ...objectOf(own.options), baseURL: sdkUrl } } } }
        : {}),
      ...(prompt.length ? { instructions: [...instructions, `~/${SYSTEM_PROMPT_FILE}`] } : {}),
    };
    return {
      env: { OPENCODE_CONFIG_CONTENT: JSON.stringify(config) },
      args: [],
      sessionModel: undefined,
      sessionMeta: undefined,
      homeFiles: prompt,
    };
  },
};

/**
 * What opencode's AI SDK providers expect after the base URL as BASE_URLS has it: Anthropic's
 * and Gemini's API versions (OpenAI's `/v1` is already there).
 */
const OPENCODE_API_PATH: Record<string, string> = { anthropic: '/v1', openai: '', google: '/v1beta' };

const objectOf = (v: unknown): Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : {};

/** A JSON object, or {} for anything else (opencode would refuse it anyway). */
function parseObject(text: string): Record<string, unknown> {
  try {
    return objectOf(JSON.parse(text));
  } catch {
    return {};
  }
}

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
    ? sandboxEnv[where.env] || (instanceUrl ? instanceUrl.replace(/\/+$/, '') + where.path : undefined)
    : undefined;
  const settings = RUNTIMES[agent.runtime]({
    model: runtimeModel(agent.runtime, agent.model),
    system: agent.system,
    baseUrl,
    sandboxEnv,
  });
  return {
    ...settings,
    env: { ...(where && baseUrl ? { [where.env]: baseUrl } : {}), ...settings.env },
  };
}
