import {
  AgentIdParam,
  ErrorBody,
  listOf,
  TeamConversation,
  Teammate,
  TeammateCreate,
  TeammateMessage,
  TeammateMessageQueued,
  TeammatePatch,
  TeamRotation,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
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
      errors: [
        'missing_credential',
        'no_runner_online',
        'sandbox_quota_exceeded',
        'fleet_full',
        'provisioning',
        'insufficient_credits',
      ],
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
        "202 `{status: queued, conversation_id}`: the prompt is the next turn of the teammate's live conversation; a suspended machine is woken first. When that conversation cannot be resumed (it was terminated or deleted), a fresh one opens on the team channel with the same name, environment and vault, the message as its first prompt, and `conversation_id` names it. 400 `conversation_busy` while a turn runs; 503 `provisioning` while its machine is being built; 503 `runner_offline` when the self-hosted runner it lives on is not connected; 404 when the agent is not on the team. With payment on, 402 `insufficient_credits` (body: `upgrade_url`) as for a prompt.",
      operationId: 'messageTeammate',
      params: AgentIdParam,
      body: TeammateMessage,
      errors: [
        'conversation_busy',
        'missing_credential',
        'provisioning',
        'runner_offline',
        'sandbox_at_capacity',
        'insufficient_credits',
      ],
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

  r.patch('/api/team/:agent_id', {
    config,
    schema: {
      tags,
      summary: 'Rename a teammate',
      description:
        "`name` titles the live conversation and every later fresh one; null or blank restores the agent's name. Audited as `team.renamed`; a `team` event goes to `/api/team/stream`. 404 when the agent is not on the team.",
      operationId: 'renameTeammate',
      params: AgentIdParam,
      body: TeammatePatch,
      response: { 200: Teammate, 404: ErrorBody, 422: ErrorBody },
    },
    handler: async (req) =>
      team.renameTeammate(teamDeps, actorOf(requirePrincipal(req)), req.params.agent_id, req.body),
  });

  r.delete('/api/team/:agent_id', {
    config,
    schema: {
      tags,
      summary: 'Take an agent off the team',
      description:
        '204. Its live conversation is terminated (its lasting machine is kept) and its team history is unbound: its conversations leave the team channel, so `GET /api/conversations?channel_id=svc:team` no longer lists them. A `team` event goes to `/api/team/stream`. 404 when the agent is not on the team.',
      operationId: 'removeTeammate',
      params: AgentIdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await team.removeTeammate(teamDeps, actorOf(requirePrincipal(req)), req.params.agent_id);
      return reply.code(204).send(null);
    },
  });

  r.get('/api/team/:agent_id/conversations', {
    config,
    schema: {
      tags,
      summary: "A teammate's conversations",
      description:
        'Every conversation the agent has had on the team, newest first; its live one has `current: true`. 404 when the agent is not on the team.',
      operationId: 'listTeammateConversations',
      params: AgentIdParam,
      response: { 200: listOf(TeamConversation), 404: ErrorBody },
    },
    handler: async (req) => ({
      data: await team.listTeamConversations(teamDeps, actorOf(requirePrincipal(req)), req.params.agent_id),
    }),
  });

  r.post('/api/team/:agent_id/conversations', {
    config,
    schema: {
      tags,
      summary: 'Start a teammate over',
      description:
        '201 `{teammate, conversation}`: a new live conversation opens on the team channel with the same name, environment and vault, on the same machine when it is up (nothing is built or interrupted), and the previous one is retired (terminated, listed with `current: false`). When the machine is gone (its sandbox failed or was destroyed) a new one is provisioned as for `POST /api/team`. 400 `conversation_busy` while a turn runs; 503 `provisioning` while its machine is being built; 404 when the agent is not on the team. Audited as `team.conversation.rotated`; a `team` event goes to `/api/team/stream`.',
      operationId: 'rotateTeammateConversation',
      params: AgentIdParam,
      errors: [
        'conversation_busy',
        'missing_credential',
        'provisioning',
        'runner_offline',
        'no_runner_online',
        'sandbox_quota_exceeded',
        'fleet_full',
        'insufficient_credits',
      ],
      response: { 201: TeamRotation, 400: ErrorBody, 404: ErrorBody, 409: ErrorBody, 422: ErrorBody, 503: ErrorBody },
    },
    handler: async (req, reply) =>
      reply.code(201).send(await team.rotateTeammate(teamDeps, actorOf(requirePrincipal(req)), req.params.agent_id)),
  });
}
