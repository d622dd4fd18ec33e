import {
  eventTypeMatches,
  type LogEvent,
  newId,
  orNotFound,
  WEBHOOK_TEST_TYPE,
  type WebhookDelivery,
  type WebhookPayload,
  webhookTypeOf,
} from '@svc/core';
import { type Sql, transaction, webhooks } from '@svc/db';
import type { z } from 'zod';
import { appendedAtMicros, clockMicros, isoMicros } from '../log/log.ts';
import { getEndpoint } from './webhooks.ts';

/*
 * Webhook delivery jobs: one per (endpoint, event), written by the consumer that reads stage
 * events from each tenant's log, and by the test and redeliver routes; sent by the delivery
 * workers (workers/webhook-delivery.ts).
 */

/** Attempts per event (SPEC Limits: 8 over about a day; see `retryDelayMs`). */
export const MAX_ATTEMPTS = 8;

/** What a job's stored `data` holds: the payload's `data` without `status`, read at dispatch. */
type JobData = Omit<z.infer<typeof WebhookPayload>['data'], 'status'>;

/**
 * Turns the stage events among `events` (a tenant's log events; others are ignored: stdout and
 * stderr make no webhooks) into one job per matching active endpoint of the account, due now.
 * Idempotent: an (endpoint, event id) that already has a job is skipped, so a consumer that
 * reads an entry twice never doubles a delivery. One transaction: all of the batch's jobs are
 * written or none. Resolves to how many jobs were new.
 */
export async function enqueueWebhookJobs(sql: Sql, accountId: string, events: LogEvent[]): Promise<number> {
  const stages = events.filter(
    (e): e is LogEvent & { stage: string; state: string; conversationId: string } =>
      e.kind === 'stage' && !!e.stage && !!e.state && e.conversationId !== null,
  );
  if (stages.length === 0) return 0;
  return transaction(sql, async (tx) => {
    const endpoints = await webhooks.activeEndpoints(tx, accountId);
    if (endpoints.length === 0) return 0;
    const facts = new Map(
      (await webhooks.conversationFacts(tx, accountId, [...new Set(stages.map((e) => e.conversationId))])).map((c) => [
        c.id,
        c,
      ]),
    );
    const now = new Date();
    const jobs: webhooks.JobInsert[] = [];
    for (const e of stages) {
      const type = webhookTypeOf(e.stage, e.state);
      const conversation = facts.get(e.conversationId);
      const data: JobData = {
        conversation_id: e.conversationId,
        agent_id: conversation?.agent_id ?? null,
        parent_conversation_id: conversation?.parent_id ?? null,
        stage: e.stage,
        state: e.state,
        turn_id: e.stage === 'turn' ? e.turnId : null,
        duration_ms: e.durationMs,
      };
      for (const endpoint of endpoints) {
        if (!eventTypeMatches(endpoint.event_types, type)) continue;
        jobs.push({
          id: newId('whj'),
          accountId,
          endpointId: endpoint.id,
          eventId: String(e.id),
          eventType: type,
          eventAt: isoMicros(appendedAtMicros(e)),
          data,
          maxAttempts: MAX_ATTEMPTS,
          due: now,
        });
      }
    }
    return webhooks.insertJobs(tx, jobs);
  });
}

/** Accounts with an active endpoint: the tenants whose logs the webhook consumer reads. */
export function tenantsWithEndpoints(sql: Sql): Promise<string[]> {
  return webhooks.tenantsWithEndpoints(sql);
}

/**
 * Queues a `webhook.test` for the endpoint, whatever its `event_types`, with an id of its own
 * (`test_...`, never a log id) and the same retries as any event, due at `now`. Its
 * `created_at` is when it was queued, read from the clock the log takes ids from.
 */
export async function queueTest(sql: Sql, accountId: string, endpointId: string, now: Date) {
  await getEndpoint(sql, accountId, endpointId);
  const eventId = `test_${newId('whj').slice(4)}`;
  const data: JobData = {
    conversation_id: null,
    agent_id: null,
    parent_conversation_id: null,
    stage: null,
    state: null,
    turn_id: null,
    duration_ms: null,
  };
  await webhooks.insertJobs(sql, [
    {
      id: newId('whj'),
      accountId,
      endpointId,
      eventId,
      eventType: WEBHOOK_TEST_TYPE,
      eventAt: isoMicros(clockMicros()),
      data,
      maxAttempts: MAX_ATTEMPTS,
      due: now,
    },
  ]);
  return { status: 'queued' as const, event: eventId, type: WEBHOOK_TEST_TYPE };
}

/** Queues one more attempt of a delivery's event, sent to the endpoint's current URL with its current secret. */
export async function redeliver(sql: Sql, accountId: string, endpointId: string, deliveryId: string, now: Date) {
  await getEndpoint(sql, accountId, endpointId);
  const job = orNotFound(await webhooks.requeueDelivery(sql, accountId, endpointId, deliveryId, now), 'Delivery');
  return { status: 'queued' as const, event: job.event_id, type: job.event_type };
}

/** The endpoint's delivery attempts, newest first; `meta.next_cursor` pages backwards through `before`. */
export async function listDeliveries(
  sql: Sql,
  accountId: string,
  endpointId: string,
  q: { limit: number; before?: string | undefined },
) {
  await getEndpoint(sql, accountId, endpointId);
  const rows = await webhooks.listDeliveries(sql, accountId, endpointId, q);
  const hasMore = rows.length > q.limit;
  const page = rows.slice(0, q.limit);
  const data: z.infer<typeof WebhookDelivery>[] = page.map((r) => ({
    id: r.id,
    event: r.event_id,
    type: r.event_type,
    try: r.attempt,
    result: r.status_code,
    took: r.duration_ms,
    detail: r.detail,
    created_at: r.created_at.toISOString(),
  }));
  return { data, meta: { limit: q.limit, has_more: hasMore, next_cursor: hasMore ? (page.at(-1)?.id ?? null) : null } };
}

/** The body of a delivery (SPEC Webhook events): ids and states only, never content. */
export function payloadOf(job: webhooks.ClaimedJob): z.infer<typeof WebhookPayload> {
  const data = job.data as JobData;
  return {
    id: job.event_id,
    type: job.event_type,
    created_at: job.event_at,
    data: {
      conversation_id: data.conversation_id,
      agent_id: data.agent_id,
      parent_conversation_id: data.parent_conversation_id,
      status: job.conversation_status,
      stage: data.stage,
      state: data.state,
      turn_id: data.turn_id,
      duration_ms: data.duration_ms,
    },
  };
}

/**
 * How long after attempt `attempt` (1-based) of a failed delivery the next one is due:
 * 75 s tripling each time (75 s, 3.75 min, 11 min, 34 min, 1.7 h, 5 h, 15 h: about 23 h
 * across the 8 attempts), each scaled by a random factor in [0.8, 1.2) so receivers that
 * failed together are not retried together.
 */
export function retryDelayMs(attempt: number, random: () => number = Math.random): number {
  return Math.round(75_000 * 3 ** (attempt - 1) * (0.8 + 0.4 * random()));
}
