import {
  AgentIdParam,
  ErrorBody,
  listOf,
  Teammate,
  TeammateCreate,
  TeammateMessage,
  TeammateMessageQueued,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { actorOf } from '../../services/principal.ts';
import * as team from '../../services/team.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['team'];

/** The team's roster and messages (`/api/team*`); schedules and the stream live beside it. */
export function teamRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };
  const teamDeps: team.TeamDeps = { launch: deps.launch, runnerOfflineAfterMs: deps.config.RUNNER_GRACE_MS };

  r.get('/api/team', {
    config,
    schema: {
      tags,
      summary: 'The team roster',
      description:
        'Every teammate of the caller in the order they joined: its name, agent, live conversation, presence, unread flag, last turn, a preview of the last message, and the usage of every conversation it had on the team.',
      operationId: 'listTeammates',
      response: { 200: listOf(Teammate) },
    },
    handler: async (req) => ({ data: await team.listTeammates(teamDeps, actorOf(requirePrincipal(req))) }),
  });

  r.post('/api/team', {
    config,
    schema: {
      tags,
      summary: 'Put an agent on the team',
      description:
        "201 with the teammate: its live conversation opens on the team channel (`svc:team`), titled `name` (else the agent's name), on the agent's one lasting sandbox for the environment and vault (a persistent machine, built now; no prompt is sent). 200 with the teammate as it is when the agent is already on the team; the attributes are then ignored. `environment_id` and `vault_id` are checked against the agent's `allowed_environment_ids` and `allowed_vault_ids`: an unknown id or another account's is 404, one not permitted 422. A `team` event goes to `/api/team/stream`.",
      operationId: 'addTeammate',
      body: TeammateCreate,
      errors: ['missing_credential', 'no_runner_online', 'sandbox_quota_exceeded', 'fleet_full', 'provisioning'],
      response: { 200: Teammate, 201: Teammate, 404: ErrorBody, 409: ErrorBody, 422: ErrorBody, 503: ErrorBody },
    },
    handler: async (req, reply) => {
      const { created, teammate } = await team.addTeammate(teamDeps, actorOf(requirePrincipal(req)), req.body);
      return reply.code(created ? 201 : 200).send(teammate);
    },
  });

  r.get('/api/team/:agent_id', {
    config,
    schema: {
      tags,
      summary: 'One teammate',
      description: "404 when the agent is not on the caller's team (an unknown agent, or another account's).",
      operationId: 'getTeammate',
      params: AgentIdParam,
      response: { 200: Teammate, 404: ErrorBody },
    },
    handler: async (req) => team.getTeammate(teamDeps, actorOf(requirePrincipal(req)), req.params.agent_id),
  });

  r.post('/api/team/:agent_id/messages', {
    config,
    schema: {
      tags,
      summary: 'Message a teammate',
      description:
        "202 `{status: queued, conversation_id}`: the prompt is the next turn of the teammate's live conversation; a suspended machine is woken first. When that conversation cannot be resumed (it was terminated or deleted), a fresh one opens on the team channel with the same name, environment and vault, the message as its first prompt, and `conversation_id` names it. 400 `conversation_busy` while a turn runs; 503 `provisioning` while its machine is being built; 503 `runner_offline` when the self-hosted runner it lives on is not connected; 404 when the agent is not on the team.",
      operationId: 'messageTeammate',
      params: AgentIdParam,
      body: TeammateMessage,
      errors: ['conversation_busy', 'missing_credential', 'provisioning', 'runner_offline', 'sandbox_at_capacity'],
      response: {
        202: TeammateMessageQueued,
        400: ErrorBody,
        404: ErrorBody,
        409: ErrorBody,
        422: ErrorBody,
        503: ErrorBody,
      },
    },
    handler: async (req, reply) => {
      const { conversationId } = await team.messageTeammate(
        teamDeps,
        actorOf(requirePrincipal(req)),
        req.params.agent_id,
        req.body,
      );
      return reply.code(202).send({ status: 'queued' as const, conversation_id: conversationId });
    },
  });
}
