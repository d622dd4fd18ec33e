import { newId, signWebhook } from '@svc/core';
import { accounts, type Sql, webhooks } from '@svc/db';
import type { Logger } from 'pino';
import type { Mailer } from '../mail/mail.ts';
import type { Keyring } from '../secrets/keyring.ts';
import { recordAudit } from '../services/audit.ts';
import { payloadOf, retryDelayMs } from '../services/webhook-jobs.ts';
import { revealSecret } from '../services/webhooks.ts';
import { postSafely, type TransportOptions } from '../webhooks/transport.ts';
import { PeriodicWorker } from './periodic.ts';

/** Events in a row that exhaust their retries before the endpoint is disabled (SPEC Limits). */
export const DISABLE_AFTER = 5;
/** Delivery rows are kept this long (SPEC Limits). */
const KEEP_MS = 30 * 24 * 3_600_000;
const PRUNE_EVERY_MS = 3_600_000;
/** How much of a response body a delivery row keeps (SPEC Limits). */
const KEEP_BYTES = 4096;

export interface WebhookDeliveryDeps {
  sql: Sql;
  keyring: Keyring;
  mailer: Mailer;
  logger: Logger;
  /** The clock jobs come due by (a test moves it). Signatures carry the wall clock's time. */
  now: () => Date;
  /** The public base URL, for the link in the owner's mail. */
  publicUrl: () => string;
  /** How addresses are resolved and which private ranges the operator allows; a test's CA. */
  transport: Pick<TransportOptions, 'resolve' | 'allowed' | 'ca'>;
  random?: () => number;
}

export interface WebhookDeliveryOptions {
  /** How often due jobs are looked for; 0 never starts the timer (a test calls `pass`). */
  periodMs: number;
  /** Requests in flight from this worker at most. */
  concurrency: number;
  /** Requests in flight to one endpoint at most, across every worker. */
  perEndpoint: number;
  /** Per request (SPEC Limits: 10 s). */
  timeoutMs: number;
}

/**
 * Sends webhook delivery jobs. Every `periodMs`, whenever a request finishes and frees a slot,
 * and whenever this process writes jobs (`workArrived`), it claims due jobs with
 * `FOR UPDATE SKIP LOCKED` under a lease, up to its free slots
 * and at most `perEndpoint` in flight per endpoint, and sends each without waiting for the
 * others: a slow or dead receiver holds its own endpoint's slots only, never another's. Each
 * attempt is recorded with the job's next step (delivered; due again after `retryDelayMs`;
 * failed after the 8th attempt). When 5 events in a row exhaust their retries the endpoint is
 * disabled, audited and its owner mailed. Any number of workers on any node share the jobs; a
 * worker killed mid-request leaves its lease to expire and the job is sent again (at least
 * once). Delivery rows older than 30 days are pruned about hourly.
 */
export class WebhookDeliveryWorker extends PeriodicWorker {
  private readonly inFlight = new Set<Promise<void>>();
  private lastPrune = 0;

  constructor(
    private readonly deps: WebhookDeliveryDeps,
    private readonly options: WebhookDeliveryOptions,
  ) {
    super(deps.logger, 'delivering webhooks');
  }

  start(): void {
    this.every(this.options.periodMs);
  }

  /** Resolves once every request this worker started has finished and been recorded. */
  async settled(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.all([...this.inFlight]);
  }

  /** Requests under way now. */
  get sending(): number {
    return this.inFlight.size;
  }

  /** Claims what is due into the free slots and starts sending it; resolves to how many it started. */
  protected async work(): Promise<number> {
    const now = this.deps.now();
    if (now.getTime() - this.lastPrune >= PRUNE_EVERY_MS) {
      this.lastPrune = now.getTime();
      await webhooks.pruneBefore(this.deps.sql, new Date(now.getTime() - KEEP_MS));
    }
    const free = this.options.concurrency - this.inFlight.size;
    // A lease outlives any request (timeout, then recording) by far; only a dead worker lets one lapse.
    const leaseUntil = new Date(now.getTime() + this.options.timeoutMs * 6);
    const jobs = await webhooks.claimDueJobs(this.deps.sql, now, leaseUntil, free, this.options.perEndpoint);
    for (const job of jobs) {
      const sent: Promise<void> = this.send(job)
        .catch((err: Error) =>
          this.deps.logger.warn({ err: { message: err.message }, jobId: job.id }, 'webhook attempt not recorded'),
        )
        .finally(() => {
          this.inFlight.delete(sent);
          // The freed slot takes the next due job now rather than at the next tick (after the
          // pass under way, if one is: it may have claimed before this slot was free).
          this.workArrived();
        });
      this.inFlight.add(sent);
    }
    return jobs.length;
  }

  private async send(job: webhooks.ClaimedJob): Promise<void> {
    const { deps } = this;
    const attempt = job.attempts + 1;
    const body = JSON.stringify(payloadOf(job));
    const secret = await revealSecret(deps, job.account_id, job.endpoint_id, job.secret_ciphertext);
    const headers = {
      'svc-signature': signWebhook(secret, body, Math.floor(Date.now() / 1000)),
      'svc-event-id': job.event_id,
      'svc-event-type': job.event_type,
      'svc-delivery-attempt': String(attempt),
    };
    const started = performance.now();
    const result = await postSafely(job.url, headers, body, {
      ...deps.transport,
      timeoutMs: this.options.timeoutMs,
      keepBytes: KEEP_BYTES,
    });
    const durationMs = Math.round(performance.now() - started);
    const accepted = result.statusCode !== null && result.statusCode >= 200 && result.statusCode <= 299;
    const at = deps.now();
    const retryAt =
      accepted || attempt >= job.max_attempts
        ? null
        : new Date(at.getTime() + retryDelayMs(attempt, deps.random ?? Math.random));
    const outcome = result.statusCode === null ? result.detail : `HTTP ${result.statusCode}`;
    const { disabled } = await webhooks.recordAttempt(
      deps.sql,
      job,
      {
        deliveryId: newId('whd'),
        statusCode: result.statusCode,
        accepted,
        durationMs,
        detail: result.detail,
        at,
        retryAt,
      },
      DISABLE_AFTER,
      `${DISABLE_AFTER} events in a row exhausted their retries (the last attempt: ${outcome.slice(0, 200)})`,
    );
    if (disabled) await this.disabled(job, outcome);
  }

  /** Audits the disable and tells the account owner how to resume. */
  private async disabled(job: webhooks.ClaimedJob, outcome: string): Promise<void> {
    const { deps } = this;
    const who = { accountId: job.account_id, actor: 'system' as const, ip: null };
    await recordAudit(
      deps.sql,
      who,
      'webhook.disabled',
      { type: 'webhook', id: job.endpoint_id },
      {
        failed_events: DISABLE_AFTER,
      },
    );
    deps.logger.info({ accountId: job.account_id, endpointId: job.endpoint_id }, 'webhook endpoint disabled');
    const account = await accounts.findAccountById(deps.sql, job.account_id);
    if (!account) return;
    const host = new URL(job.url).host;
    const lines = [
      `Deliveries to your webhook endpoint ${job.endpoint_id} (${host}) failed for ${DISABLE_AFTER} events in a row, each after every retry, so the endpoint is now disabled and nothing more is sent to it.`,
      `The last attempt: ${outcome.slice(0, 200)}`,
      `Once the receiver works again, resume it with POST ${deps.publicUrl()}/api/webhooks/${job.endpoint_id}/resume (or PATCH it with status "active"), then send a test with POST ${deps.publicUrl()}/api/webhooks/${job.endpoint_id}/test.`,
    ];
    const html = (l: string) => l.replace(/&/g, '&amp;').replace(/</g, '&lt;');
    await deps.mailer
      .send({
        to: account.email,
        subject: `Webhook endpoint disabled: ${host}`,
        text: lines.join('\n\n'),
        html: lines.map((l) => `<p>${html(l)}</p>`).join('\n'),
      })
      .catch((err: Error) => deps.logger.error({ err: { message: err.message } }, 'mail could not be sent'));
  }
}
