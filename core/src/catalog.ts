/**
 * What the service knows about runtimes, model providers and the rest of `GET /api/catalog`.
 * Model lists are suggestions only: a model is never checked against them, only its provider
 * against the runtime.
 */
export const RUNTIMES = ['claude', 'codex', 'gemini', 'opencode'] as const;
export type Runtime = (typeof RUNTIMES)[number];

/** Providers a `provider/model_id` may name. opencode accepts any of them. */
export const MODEL_PROVIDERS = [
  'anthropic',
  'openai',
  'google',
  'openrouter',
  'groq',
  'mistral',
  'xai',
  'deepseek',
  'amazon-bedrock',
  'azure',
] as const;

/** The providers each runtime can drive. */
export const RUNTIME_PROVIDERS: Record<Runtime, readonly string[]> = {
  claude: ['anthropic'],
  codex: ['openai'],
  gemini: ['google'],
  opencode: MODEL_PROVIDERS,
};

export const RUNTIME_INFO: Record<Runtime, { name: string; models: string[] }> = {
  claude: {
    name: 'Claude Code',
    models: ['anthropic/claude-sonnet-4-5', 'anthropic/claude-opus-4-1', 'anthropic/claude-haiku-4-5'],
  },
  codex: { name: 'Codex', models: ['openai/gpt-5-codex', 'openai/gpt-5', 'openai/gpt-5-mini'] },
  gemini: { name: 'Gemini CLI', models: ['google/gemini-2.5-pro', 'google/gemini-2.5-flash'] },
  opencode: {
    name: 'opencode',
    models: ['anthropic/claude-sonnet-4-5', 'openai/gpt-5', 'google/gemini-2.5-pro', 'openrouter/qwen/qwen3-coder'],
  },
};

export const SANDBOX_PROVIDERS = ['sprites', 'e2b', 'daytona', 'runner'] as const;
export const SANDBOX_MODES = ['ephemeral', 'persistent'] as const;
export const PACKAGE_MANAGERS = ['apt', 'npm'] as const;
export const AVATAR_BASES = ['robot', 'fox', 'owl', 'cat', 'octopus', 'astronaut', 'bear', 'dragon'] as const;
export const AVATAR_MOODS = ['cheerful', 'focused', 'calm', 'curious', 'determined', 'sleepy'] as const;

/** The model's provider, or undefined when `model` is not `provider/model_id`. */
export function providerOf(model: string): string | undefined {
  const slash = model.indexOf('/');
  return slash > 0 && slash < model.length - 1 ? model.slice(0, slash) : undefined;
}

/**
 * The model as the runtime's agent names it: without the provider for the runtimes of one
 * provider (`anthropic/claude-sonnet-4-5` is `claude-sonnet-4-5` to Claude Code), whole for
 * opencode, which names models `provider/model_id` itself.
 */
export function runtimeModel(runtime: Runtime, model: string): string {
  const provider = providerOf(model);
  return provider && RUNTIME_PROVIDERS[runtime].length === 1 ? model.slice(provider.length + 1) : model;
}

/** Why a model cannot run on a runtime, or undefined when it can. */
export function modelProblem(runtime: Runtime, model: string): string | undefined {
  const provider = providerOf(model);
  if (!provider) return 'must be provider/model_id';
  const allowed = RUNTIME_PROVIDERS[runtime];
  if (!allowed.includes(provider)) {
    return allowed.length === 1
      ? `provider must be ${allowed[0]} for runtime ${runtime}`
      : `unknown provider ${provider}; one of ${allowed.join(', ')}`;
  }
  return undefined;
}
