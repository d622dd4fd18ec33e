import { ErrorBody, PermissionAnswerBody, PermissionRequest, PermissionRequestParams } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { answerPermissionRequest } from '../../services/permissions.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['conversations'];

export function permissionRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();

  r.post('/api/conversations/:id/requests/:request_id', {
    // Sandbox tokens reach this route only to be told they may not answer.
    config: { auth: 'user', sprite: true },
    schema: {
      tags,
      summary: 'Answer a permission request',
      operationId: 'answerPermissionRequest',
      description:
        'The request and its options arrive as a `permission_request` block on the conversation’s log; send one of the offered `optionId` values as `option_id`. The first answer wins and goes to the runtime; later answers get 409 `permission_request_resolved` (the body’s `request` says how it was resolved). An option that was not offered is 422 `unknown_option` and changes nothing. A sandbox token gets 403 `sprite_may_not_answer`. 503 `runner_offline` when the runner cannot take the answer (the request stays pending). A request unanswered for PERMISSION_TIMEOUT_S, or still open when its turn ends, is denied (the runtime gets the first reject option) and the turn goes on.',
      params: PermissionRequestParams,
      body: PermissionAnswerBody,
      errors: [
        'forbidden',
        'sprite_may_not_answer',
        'not_found',
        'permission_request_resolved',
        'conversation_terminated',
        'unknown_option',
        'runner_offline',
      ],
      response: {
        200: PermissionRequest,
        400: ErrorBody,
        401: ErrorBody,
        403: ErrorBody,
        404: ErrorBody,
        409: ErrorBody,
        422: ErrorBody,
        503: ErrorBody,
      },
    },
    handler: async (req) =>
      answerPermissionRequest(
        { sql: deps.sql, fabric: deps.fabric },
        actorOf(requirePrincipal(req)),
        req.params.id,
        req.params.request_id,
        req.body.option_id,
      ),
  });
}
