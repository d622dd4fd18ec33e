import type { Runtime } from '@svc/core';
import type { agents } from '@svc/db';

/** An agent on the wire (SPEC "Agents"), from its row: the one shape every route answers with. */
export function shapeAgent(row: agents.AgentRow) {
  return {
    id: row.id,
    name: row.name,
    description: row.description,
    system: row.system,
    runtime: row.runtime as Runtime,
    model: row.model,
    environment_id: row.environment_id,
    skills: row.skills as ({ source: string; ref?: string } | { name: string; content: string })[],
    mcp_servers: row.mcp_servers,
    sandbox_provider: row.sandbox_provider as 'sprites' | 'e2b' | 'daytona' | 'runner' | null,
    sandbox_mode: row.sandbox_mode as 'ephemeral' | 'persistent',
    allowed_vault_ids: row.allowed_vault_ids,
    allowed_environment_ids: row.allowed_environment_ids,
    permission_policy: row.permission_policy as { default: 'auto_allow' | 'ask'; ask: string[] },
    avatar_media_type: row.avatar_media_type,
    conversation_count: row.conversation_count,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}
