// What each runtime is handed for an agent, checked at the seam (runtimeSettings). The real
// agents prove that they take it (launch-claude, launch-codex, launch-opencode, launch-gemini);
// these are the cases those do not reach: a sandbox's own endpoint, its own opencode
// configuration, an empty system prompt, and a system prompt TOML must escape.
import t from 'tap';
import { credentialsFor, runtimeSettings } from '../../gateway/src/services/runtime-settings.ts';

const INSTANCE = {
  anthropic: 'https://api.anthropic.com',
  openai: 'https://api.openai.com/',
  google: 'https://generativelanguage.googleapis.com',
};

t.test("a runtime is sent to the instance's endpoint of its provider unless the sandbox names its own", async (t) => {
  const claude = runtimeSettings({ runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', system: '' }, {}, INSTANCE);
  t.same(claude.env, {
    ANTHROPIC_BASE_URL: 'https://api.anthropic.com',
    ANTHROPIC_MODEL: 'claude-sonnet-4-5',
    CLAUDE_CODE_MAX_RETRIES: '2',
  });
  const gemini = runtimeSettings(
    { runtime: 'gemini', model: 'google/gemini-2.5-pro', system: '' },
    { GOOGLE_GEMINI_BASE_URL: 'https://gemini.proxy.example' },
    INSTANCE,
  );
  t.same(gemini.env, { GOOGLE_GEMINI_BASE_URL: 'https://gemini.proxy.example', GEMINI_MODEL: 'gemini-2.5-pro' });
  const codex = runtimeSettings({ runtime: 'codex', model: 'openai/gpt-5.4', system: '' }, {}, INSTANCE);
  t.equal(codex.env.OPENAI_BASE_URL, 'https://api.openai.com/v1', "OpenAI's clients have /v1 in the base URL");
  t.ok(codex.args.includes('model_providers.svc_openai.base_url="https://api.openai.com/v1"'), codex.args.join(' '));
  const own = runtimeSettings(
    { runtime: 'codex', model: 'openai/gpt-5.4', system: '' },
    { OPENAI_BASE_URL: 'https://llm.internal.example/v1' },
    INSTANCE,
  );
  t.ok(own.args.includes('model_providers.svc_openai.base_url="https://llm.internal.example/v1"'), own.args.join(' '));
});

t.test('codex gets its model and system prompt as -c options whose values are TOML strings', async (t) => {
  const system = 'Sign as "Captain"\\o/\nthen stop.\u007f';
  const { args, env, homeFiles, sessionMeta } = runtimeSettings(
    { runtime: 'codex', model: 'openai/gpt-5.4', system },
    {},
    INSTANCE,
  );
  const options = args.filter((_, i) => args[i - 1] === '-c');
  t.equal(options.length * 2, args.length, 'every option follows a -c');
  t.ok(options.includes('model="gpt-5.4"'));
  t.ok(options.includes('model_provider="svc_openai"'));
  t.ok(options.includes('model_providers.svc_openai.env_key="OPENAI_API_KEY"'));
  t.ok(
    options.includes('developer_instructions="Sign as \\"Captain\\"\\\\o/\\nthen stop.\\u007f"'),
    'quotes, backslash, newline and DEL escaped as TOML wants them',
  );
  t.same([env.OPENAI_BASE_URL, homeFiles, sessionMeta], ['https://api.openai.com/v1', [], undefined]);
  const silent = runtimeSettings({ runtime: 'codex', model: 'openai/gpt-5.4', system: '  ' }, {}, INSTANCE);
  t.notOk(
    silent.args.some((a) => a.startsWith('developer_instructions=')),
    'no developer instructions without a prompt',
  );
});

t.test("opencode's configuration is laid over the sandbox's own, and its prompt is a file", async (t) => {
  const sandboxConfig = {
    theme: 'dark',
    instructions: ['CONTRIBUTING.md'],
    provider: { openai: { options: { timeout: 1000 } }, ollama: { npm: '@ai-sdk/openai-compatible' } },
  };
  const { env, homeFiles, args } = runtimeSettings(
    { runtime: 'opencode', model: 'openai/gpt-5.4', system: 'Be brief.' },
    { OPENCODE_CONFIG_CONTENT: JSON.stringify(sandboxConfig) },
    INSTANCE,
  );
  t.same(JSON.parse(env.OPENCODE_CONFIG_CONTENT ?? '{}'), {
    theme: 'dark',
    model: 'openai/gpt-5.4',
    instructions: ['CONTRIBUTING.md', '~/.svc/system-prompt.md'],
    provider: {
      openai: { options: { timeout: 1000, baseURL: 'https://api.openai.com/v1' } },
      ollama: { npm: '@ai-sdk/openai-compatible' },
    },
  });
  t.same(homeFiles, [{ path: '.svc/system-prompt.md', content: 'Be brief.' }]);
  t.same(args, []);
  const anthropic = runtimeSettings(
    { runtime: 'opencode', model: 'anthropic/claude-sonnet-4-5', system: '' },
    { OPENCODE_CONFIG_CONTENT: 'not json' },
    INSTANCE,
  );
  t.same(
    JSON.parse(anthropic.env.OPENCODE_CONFIG_CONTENT ?? '{}'),
    {
      model: 'anthropic/claude-sonnet-4-5',
      provider: { anthropic: { options: { baseURL: 'https://api.anthropic.com/v1' } } },
    },
    "the AI SDK's Anthropic base URL has /v1; no prompt, no instructions; a configuration that is not JSON is dropped",
  );
  t.same(anthropic.homeFiles, []);
  const other = runtimeSettings(
    { runtime: 'opencode', model: 'openrouter/qwen/qwen3-coder', system: '' },
    {},
    INSTANCE,
  );
  t.same(JSON.parse(other.env.OPENCODE_CONFIG_CONTENT ?? '{}'), { model: 'openrouter/qwen/qwen3-coder' });
});

t.test('gemini and claude take the system prompt their own ways', async (t) => {
  const gemini = runtimeSettings(
    { runtime: 'gemini', model: 'google/gemini-2.5-pro', system: 'Be brief.' },
    {},
    INSTANCE,
  );
  t.same(gemini.homeFiles, [{ path: '.gemini/GEMINI.md', content: 'Be brief.' }]);
  const claude = runtimeSettings(
    { runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', system: 'Be brief.' },
    {},
    INSTANCE,
  );
  t.same([claude.sessionMeta, claude.sessionModel], [{ systemPrompt: { append: 'Be brief.' } }, 'claude-sonnet-4-5']);
});

t.test('opencode on an Anthropic model needs an API key: it reads no Claude Code OAuth token', async (t) => {
  const names = (runtime: 'claude' | 'opencode', provider: string) =>
    credentialsFor(runtime, provider)?.map((c) => `${c.provider} ${c.env}`);
  t.same(names('claude', 'anthropic'), [
    'anthropic_api_key ANTHROPIC_API_KEY',
    'claude_code_oauth_token CLAUDE_CODE_OAUTH_TOKEN',
  ]);
  t.same(names('opencode', 'anthropic'), ['anthropic_api_key ANTHROPIC_API_KEY']);
  t.same(names('opencode', 'openai'), ['openai_api_key OPENAI_API_KEY']);
  t.equal(names('opencode', 'openrouter'), undefined, 'a provider whose key opencode finds in its own configuration');
});

t.test("a runtime's retries of its provider are bounded unless the sandbox sets its own", async (t) => {
  const agent = { runtime: 'claude', model: 'anthropic/claude-sonnet-4-5', system: '' } as const;
  t.equal(runtimeSettings(agent, {}, INSTANCE).env.CLAUDE_CODE_MAX_RETRIES, '2', 'Claude Code: a few, not 10');
  t.equal(
    runtimeSettings(agent, { CLAUDE_CODE_MAX_RETRIES: '7' }, INSTANCE).env.CLAUDE_CODE_MAX_RETRIES,
    '7',
    "the sandbox's own value",
  );
  const codex = runtimeSettings({ runtime: 'codex', model: 'openai/gpt-5.4', system: '' }, {}, INSTANCE);
  t.ok(codex.args.includes('model_providers.svc_openai.request_max_retries=2'), codex.args.join(' '));
  t.ok(codex.args.includes('model_providers.svc_openai.stream_max_retries=2'), codex.args.join(' '));
});
