import {
  DEFAULT_WEBHOOK_EVENT_TYPES,
  ErrorBody,
  IdParam,
  listOf,
  WebhookDeliveryPage,
  WebhookDeliveryParams,
  WebhookDeliveryQuery,
  WebhookEndpoint,
  WebhookEndpointCreate,
  WebhookEndpointPatch,
  WebhookEndpointWithSecret,
  WebhookQueued,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { exemptList } from '../../addresses.ts';
import { actorOf } from '../../services/principal.ts';
import * as jobs from '../../services/webhook-jobs.ts';
import * as webhooks from '../../services/webhooks.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['webhooks'];

const DELIVERY =
  'Each delivery is a POST of `{id, type, created_at, data}` (ids and states only, never content) signed `Svc-Signature: t=<unix>,v1=<hex>` (HMAC-SHA256 of `<t>.<raw body>` with the secret), with `Svc-Event-Id`, `Svc-Event-Type` and `Svc-Delivery-Attempt`. Any status outside 200-299 (a 3xx too: redirects are not followed) is retried, 8 attempts over about a day; after 5 events in a row exhaust their retries the endpoint is disabled and the owner mailed.';

/** The webhook endpoints of the caller's account; every route needs a full-scope credential. */
export function webhookRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const config = { auth: 'full' as const };
  const svc: webhooks.WebhookDeps = {
    sql: deps.sql,
    keyring: deps.keyring,
    allowHttp: deps.config.WEBHOOK_ALLOW_HTTP,
    allowed: exemptList(deps.config.WEBHOOK_ALLOW_CIDRS),
  };

  r.get('/api/webhooks', {
    config,
    schema: {
      tags,
      summary: "The account's webhook endpoints",
      description: 'Oldest first. Secrets are never listed. Needs a full-scope credential.',
      operationId: 'listWebhooks',
      response: { 200: listOf(WebhookEndpoint) },
    },
    handler: async (req) => ({ data: await webhooks.listEndpoints(deps.sql, requirePrincipal(req).accountId) }),
  });

  r.post('/api/webhooks', {
    config,
    schema: {
      tags,
      summary: 'Register a webhook endpoint; the answer shows its signing secret, once',
      description: `\`event_types\` absent: ${DEFAULT_WEBHOOK_EVENT_TYPES.join(', ')}. A mistyped type, a URL that is not \`https://\` (unless the instance sets WEBHOOK_ALLOW_HTTP), one with credentials, or one naming an address that is not public is 422 \`validation_failed\` with the reason under \`details\`. ${DELIVERY} Needs a full-scope credential.`,
      operationId: 'createWebhook',
      body: WebhookEndpointCreate,
      response: { 201: WebhookEndpointWithSecret, 422: ErrorBody },
    },
    handler: async (req, reply) =>
      reply.code(201).send(await webhooks.createEndpoint(svc, actorOf(requirePrincipal(req)), req.body)),
  });

  r.get('/api/webhooks/:id', {
    config,
    schema: {
      tags,
      summary: 'One webhook endpoint',
      description: "`status: disabled` comes with `disabled_reason`. 404 for an unknown endpoint or another account's.",
      operationId: 'getWebhook',
      params: IdParam,
      response: { 200: WebhookEndpoint, 404: ErrorBody },
    },
    handler: async (req) =>
      webhooks.shapeEndpoint(await webhooks.getEndpoint(deps.sql, requirePrincipal(req).accountId, req.params.id)),
  });

  r.patch('/api/webhooks/:id', {
    config,
    schema: {
      tags,
      summary: 'Update a webhook endpoint (the fields present)',
      description:
        'The URL and `event_types` rules of create apply. `status: active` resumes a disabled endpoint and resets its failure count (as POST /resume); `status: disabled` stops delivery. The next delivery uses the new URL, retries of earlier events included. 404 as for GET.',
      operationId: 'updateWebhook',
      params: IdParam,
      body: WebhookEndpointPatch,
      response: { 200: WebhookEndpoint, 404: ErrorBody, 422: ErrorBody },
    },
    handler: async (req) => webhooks.updateEndpoint(svc, actorOf(requirePrincipal(req)), req.params.id, req.body),
  });

  r.delete('/api/webhooks/:id', {
    config,
    schema: {
      tags,
      summary: 'Delete a webhook endpoint',
      description: 'Its queued deliveries and delivery history go with it. 404 as for GET.',
      operationId: 'deleteWebhook',
      params: IdParam,
      response: { 204: z.null(), 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await webhooks.deleteEndpoint(svc, actorOf(requirePrincipal(req)), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.post('/api/webhooks/:id/rotate-secret', {
    config,
    schema: {
      tags,
      summary: 'Replace the signing secret; the answer shows the new one, once',
      description:
        'The old secret stops verifying at once: every delivery from now on, retries of earlier events included, is signed with the new one only. 404 as for GET.',
      operationId: 'rotateWebhookSecret',
      params: IdParam,
      response: { 200: WebhookEndpointWithSecret, 404: ErrorBody },
    },
    handler: async (req) => webhooks.rotateSecret(svc, actorOf(requirePrincipal(req)), req.params.id),
  });

  r.post('/api/webhooks/:id/resume', {
    config,
    schema: {
      tags,
      summary: 'Resume a disabled webhook endpoint',
      description:
        'The endpoint turns `active`, its failure count starts again from 0, and the resume is audited (`webhook.resumed`). A disabled endpoint gets no jobs, so events that happened while it was disabled are never sent to it; deliveries still pending from before it was disabled (retries under way) go out once due, at once for those that came due meanwhile. Send a test next to check the receiver. On an endpoint that is already active it does the same: the failure count is reset and the call audited. 404 as for GET.',
      operationId: 'resumeWebhook',
      params: IdParam,
      response: { 200: WebhookEndpoint, 404: ErrorBody },
    },
    handler: async (req) => webhooks.resumeEndpoint(svc, actorOf(requirePrincipal(req)), req.params.id),
  });

  r.post('/api/webhooks/:id/test', {
    config,
    schema: {
      tags,
      summary: 'Queue a signed webhook.test delivery',
      description:
        "Sent whatever the endpoint's `event_types`, with an id of its own (`test_...`) and the retries of any event; watch its outcome in the deliveries. 202; 404 as for GET.",
      operationId: 'testWebhook',
      params: IdParam,
      response: { 202: WebhookQueued, 404: ErrorBody },
    },
    handler: async (req, reply) => {
      const queued = await jobs.queueTest(deps.sql, requirePrincipal(req).accountId, req.params.id, new Date());
      deps.webhookJobsQueued();
      return reply.code(202).send(queued);
    },
  });

  r.get('/api/webhooks/:id/deliveries', {
    config,
    schema: {
      tags,
      summary: "An endpoint's delivery attempts, newest first",
      description:
        '`limit` default 50, max 200; `before` takes `meta.next_cursor` to page backwards. `result` is the status the receiver answered (null when none came), `detail` the first 4 KB of its answer or why none came. Kept 30 days. 404 as for GET.',
      operationId: 'listWebhookDeliveries',
      params: IdParam,
      querystring: WebhookDeliveryQuery,
      response: { 200: WebhookDeliveryPage, 404: ErrorBody },
    },
    handler: async (req) => jobs.listDeliveries(deps.sql, requirePrincipal(req).accountId, req.params.id, req.query),
  });

  r.post('/api/webhooks/:id/deliveries/:delivery_id/redeliver', {
    config,
    schema: {
      tags,
      summary: "Send a delivery's event again",
      description:
        "Queues the event to be sent now, to the endpoint's current URL signed with its current secret. An event still being retried keeps the retries it has left; for a finished one this is one more attempt, whose failure is not retried and does not count toward disabling. 202; 404 for an unknown delivery or endpoint.",
      operationId: 'redeliverWebhook',
      params: WebhookDeliveryParams,
      response: { 202: WebhookQueued, 404: ErrorBody },
    },
    handler: async (req, reply) => {
      const { accountId } = requirePrincipal(req);
      const queued = await jobs.redeliver(deps.sql, accountId, req.params.id, req.params.delivery_id, new Date());
      deps.webhookJobsQueued();
      return reply.code(202).send(queued);
    },
  });
}
