import type { OpenApiDoc } from './discovery.ts';

/**
 * Example bodies for the main resources, shown by the docs viewer and carried into generated
 * clients. One example per resource serves both directions: each place it is shown keeps only
 * the fields its schema declares, so a request example is the resource without its server
 * fields (`id`, counts, timestamps). A test validates every example against its schema.
 */

const at = '2026-11-23T06:17:38.123Z';

const environment = {
  id: 'env_01kaqz4v0c3m7d9x2f5h8j6k1n',
  name: 'shop',
  packages: { apt: ['ripgrep'], npm: ['typescript@5.9.3'] },
  env_vars: { NODE_ENV: 'test' },
  repositories: [{ url: 'https://github.com/acme/shop.git', mount_path: 'shop' }],
  setup_script: 'cd shop && npm ci',
  networking_type: 'limited',
  networking_config: { allowed_hosts: ['registry.npmjs.org', 'github.com'] },
  secret_count: 1,
  agent_count: 1,
  created_at: at,
  updated_at: at,
};

const agent = {
  id: 'agt_01kaqz5b7r2t4w6y8a0c2e4g6j',
  name: 'reviewer',
  description: 'Reviews pull requests of the shop',
  system: 'You review code. Be brief and concrete.',
  runtime: 'claude',
  model: 'anthropic/claude-sonnet-4-5',
  environment_id: environment.id,
  skills: [{ name: 'house-style', content: 'Prefer small functions; name things for what they do.' }],
  mcp_servers: { files: { command: 'npx', args: ['-y', '@modelcontextprotocol/server-filesystem', '/work'] } },
  sandbox_provider: null,
  sandbox_mode: 'ephemeral',
  allowed_vault_ids: null,
  allowed_environment_ids: null,
  permission_policy: { default: 'ask', ask: ['execute', 'delete'] },
  avatar_media_type: null,
  conversation_count: 3,
  created_at: at,
  updated_at: at,
};

const vault = {
  id: 'vlt_01kaqz6e1g3j5m7p9r1t3v5x7z',
  name: 'deploy-keys',
  secret_count: 2,
  created_at: at,
  updated_at: at,
};

const conversation = {
  id: 'cnv_01kaqz7h4k6n8q0s2u4w6y8a0c',
  title: 'Review the checkout refactor',
  status: 'running',
  source: 'ui',
  parent_id: null,
  agent_id: agent.id,
  sandbox_id: 'sbx_01kaqz7j5m7p9r1t3v5x7z9b1d',
  channel_id: null,
  turn_count: 1,
  last_active_at: at,
  last_read_at: null,
  unread: true,
  usage_total: { input: 0, output: 0 },
  created_at: at,
};

const prompt = { prompt: 'Review the diff in shop/src/checkout and list what must change before merging.' };

const turn = {
  id: 'trn_01kaqz8m7p9r1t3v5x7z9b1d3f',
  number: 1,
  prompt: prompt.prompt,
  origin: 'user',
  image_count: 0,
  state: 'done',
  usage: { input: 18250, output: 912 },
  error: null,
  reply: 'Two things must change: the retry loop in pay.ts swallows errors, and the cart total is computed twice.',
  created_at: at,
  ended_at: '2026-11-23T06:18:02.456Z',
};

const runner = {
  id: 'rnr_01kaqz9q0s2u4w6y8a0c2e4g6j',
  name: 'build-box',
  hostname: 'build-box.internal',
  online: true,
  path: '/srv/svc-runner',
  version: '0.1.0',
  last_seen: at,
  created_at: at,
  token: 'svcr_NjFQsnGPzQTWawtJATU3WEKQgpIdpgNncwTJYoB30Ow',
};

const searchHit = {
  kind: 'reply',
  conversation_id: conversation.id,
  agent_id: agent.id,
  turn_id: turn.id,
  turn_number: turn.number,
  snippet: 'Two things must change: the retry loop in pay.ts swallows errors, and the cart total is computed twice.',
  ts: at,
};

/** By component schema name. */
const RESOURCES: Record<string, object> = {
  Agent: agent,
  Environment: environment,
  Vault: vault,
  Conversation: conversation,
  Turn: turn,
  Runner: runner,
  SearchHit: searchHit,
};

/** Request bodies, by operationId. */
const REQUESTS: Record<string, object> = {
  createAgent: agent,
  putAgent: { system: agent.system, permission_policy: agent.permission_policy },
  updateAgent: { system: agent.system, permission_policy: agent.permission_policy },
  createEnvironment: environment,
  putEnvironment: { setup_script: environment.setup_script },
  updateEnvironment: { setup_script: environment.setup_script },
  createVault: vault,
  renameVault: vault,
  createRunner: runner,
  createConversation: { agent_id: agent.id, ...prompt, sandbox_mode: 'ephemeral' },
  sendPrompt: prompt,
};

/** Response bodies that are not a component (which carries its own example), by operationId. */
const RESPONSES: Record<string, object> = { createRunner: runner };

interface Schema {
  properties?: Record<string, unknown>;
  examples?: unknown[];
}
interface Media {
  schema?: Schema;
  example?: unknown;
}

/** The example with only the fields the schema declares (all of it when none are declared). */
function fit(example: object, schema: Schema | undefined): object {
  const declared = schema?.properties;
  if (!declared) return example;
  return Object.fromEntries(Object.entries(example).filter(([key]) => key in declared));
}

export function addExamples(d: OpenApiDoc): void {
  const schemas = (d.components?.schemas ?? {}) as Record<string, Schema>;
  for (const [name, example] of Object.entries(RESOURCES)) {
    const schema = schemas[name];
    if (schema) schema.examples = [fit(example, schema)];
  }
  for (const item of Object.values(d.paths)) {
    for (const op of Object.values(item)) {
      const id = op.operationId ?? '';
      const request = op.requestBody?.content?.['application/json'] as Media | undefined;
      const requestExample = REQUESTS[id];
      if (request && requestExample) request.example = fit(requestExample, request.schema);
      const responseExample = RESPONSES[id];
      if (!responseExample) continue;
      for (const [status, response] of Object.entries(op.responses ?? {})) {
        const media = response.content?.['application/json'] as Media | undefined;
        if (status.startsWith('2') && media) media.example = fit(responseExample, media.schema);
      }
    }
  }
}
