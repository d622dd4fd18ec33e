import { ApiError } from '@svc/core';
import { agents, conversations } from '@svc/db';
import { type LaunchDeps, sendPrompt } from './launch.ts';
import type { Teammate, TeamOps } from './team-mcp.ts';

/**
 * The team as the conversations on the team channel show it, for the team MCP server until
 * the roster has a home of its own: each live conversation on `svc:team` is a teammate named
 * by its title, and a message is the next prompt of that conversation.
 */
export function channelTeam(launch: LaunchDeps): TeamOps {
  const { sql } = launch;
  const live = async (accountId: string) =>
    (
      await conversations.listConversations(sql, accountId, { channelId: 'svc:team', statuses: ['idle', 'running'] })
    ).filter((c) => c.parent_id === null);
  return {
    async listTeammates(who) {
      const out: Teammate[] = [];
      for (const c of await live(who.accountId)) {
        const agent = await agents.getAgent(sql, who.accountId, c.agent_id);
        if (!agent) continue;
        const working = c.status === 'running';
        out.push({
          name: c.title || agent.name,
          agent: { id: agent.id, name: agent.name, description: agent.description },
          conversation: { id: c.id, status: c.status },
          presence: { state: working ? 'working' : 'online', label: working ? 'Working on a turn' : 'Online' },
        });
      }
      return out;
    },
    async messageTeammate(who, agentId, message) {
      const conv = (await live(who.accountId)).find((c) => c.agent_id === agentId);
      if (!conv) throw new ApiError('not_found', `Agent ${agentId} is not on the team.`);
      return { conversationId: conv.id, turn: await sendPrompt(launch, who, conv.id, message) };
    },
  };
}
