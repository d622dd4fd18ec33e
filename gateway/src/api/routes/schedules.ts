import {
  AgentIdParam,
  ErrorBody,
  listOf,
  Schedule,
  ScheduleCreate,
  ScheduleParams,
  SchedulePatch,
  ScheduleRunQueued,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { actorOf } from '../../services/principal.ts';
import { type RunDeps, runScheduleNow } from '../../services/schedule-runs.ts';
import * as schedules from '../../services/schedules.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['schedules'];

const CRON_RULES =
  '`cron` is five fields (minute hour day-of-month month day-of-week) evaluated in UTC, or a name in the `@daily` style (`@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`); `@reboot`, six fields or a value out of range is 422 `validation_failed` with the reason under `details.cron`.';

export function scheduleRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'user' as const };
  const scheduleDeps: RunDeps = { sql: deps.sql, launch: deps.launch, now: () => new Date() };

  r.get('/api/team/schedules', {
    config,
    schema: {
      tags,
      summary: 'Every schedule of the caller',
      description: 'Soonest `next_run_at` first; disabled schedules (no next run) last.',
      operationId: 'listAllSchedules',
      response: { 200: listOf(Schedule) },
    },
    handler: async (req) => ({
      data: (await schedules.listAllSchedules(deps.sql, requirePrincipal(req).accountId)).map(schedules.shapeSchedule),
    }),
  });

  r.get('/api/team/:agent_id/schedules', {
    config,
    schema: {
      tags,
      summary: "An agent's schedules",
      description: "Soonest first. 404 for an unknown agent or another account's.",
      operationId: 'listAgentSchedules',
      params: AgentIdParam,
      response: { 200: listOf(Schedule), 404: ErrorBody },
    },
    handler: async (req) => ({
      data: (await schedules.listAgentSchedules(deps.sql, requirePrincipal(req).accountId, req.params.agent_id)).map(
        schedules.shapeSchedule,
      ),
    }),
  });

  r.post('/api/team/:agent_id/schedules', {
    config,
    schema: {
      tags,
      summary: 'Create a schedule',
      description: `${CRON_RULES} \`one_off\` (default false) sends the prompt into the teammate's own conversation as a typed message; true opens a fresh conversation on a new machine for each run. \`enabled\` defaults to true; a disabled schedule has \`next_run_at\` null. The agent must be the caller's (404 otherwise) but need not be on the team.`,
      params: AgentIdParam,
      body: ScheduleCreate,
      response: { 201: Schedule, 404: ErrorBody, 422: ErrorBody },
    },
    handler: async (req, reply) =>
      reply
        .code(201)
        .send(
          schedules.shapeSchedule(
            await schedules.createSchedule(scheduleDeps, actorOf(requirePrincipal(req)), req.params.agent_id, req.body),
          ),
        ),
  });

  r.get('/api/team/:agent_id/schedules/:id', {
    config,
    schema: {
      tags,
      summary: 'One schedule',
      description: "404 for an unknown schedule, another account's, or one addressed under another agent's path.",
      params: ScheduleParams,
      response: { 200: Schedule, 404: ErrorBody },
    },
    handler: async (req) =>
      schedules.shapeSchedule(
        await schedules.getSchedule(deps.sql, requirePrincipal(req).accountId, req.params.agent_id, req.params.id),
      ),
  });

  r.patch('/api/team/:agent_id/schedules/:id', {
    config,
    schema: {
      tags,
      summary: 'Update a schedule (the fields present)',
      description: `${CRON_RULES} A new \`cron\` or \`enabled\` computes \`next_run_at\` again from now. 404 as for GET.`,
      params: ScheduleParams,
      body: SchedulePatch,
      response: { 200: Schedule, 404: ErrorBody, 422: ErrorBody },
    },
    handler: async (req) =>
      schedules.shapeSchedule(
        await schedules.updateSchedule(
          scheduleDeps,
          actorOf(requirePrincipal(req)),
          req.params.agent_id,
          req.params.id,
          req.body,
        ),
      ),
  });

  r.delete('/api/team/:agent_id/schedules/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete a schedule',
      description: 'It never fires again. 404 as for GET.',
      params: ScheduleParams,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await schedules.deleteSchedule(deps, actorOf(requirePrincipal(req)), req.params.agent_id, req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.post('/api/team/:agent_id/schedules/:id/run', {
    config,
    schema: {
      tags,
      summary: 'Run a schedule now',
      description:
        "202 `{status: queued, conversation_id}` once the prompt is handed over. `one_off: true` opens a fresh conversation for the agent on a new ephemeral machine, even for a persistent agent (its environment, as a launch does; the launch's errors apply: 422 `missing_credential`, 409 `no_runner_online`, 429 `sandbox_quota_exceeded`, 503 `fleet_full`). An in-thread schedule prompts the teammate's own conversation: 404 when the agent is not on the team, 400 `conversation_busy` while its previous turn runs, 503 `provisioning` while its machine starts. `last_run_at` and `last_error` are stamped either way, and the run is audited as `team.schedule.run`. 404 as for GET.",
      params: ScheduleParams,
      errors: [
        'not_found',
        'conversation_busy',
        'missing_credential',
        'no_runner_online',
        'sandbox_quota_exceeded',
        'fleet_full',
        'provisioning',
        'runner_offline',
        'insufficient_credits',
      ],
      response: {
        202: ScheduleRunQueued,
        400: ErrorBody,
        404: ErrorBody,
        409: ErrorBody,
        422: ErrorBody,
        503: ErrorBody,
      },
    },
    handler: async (req, reply) =>
      reply
        .code(202)
        .send(await runScheduleNow(scheduleDeps, actorOf(requirePrincipal(req)), req.params.agent_id, req.params.id)),
  });
}
