import type postgres from 'postgres';
import { type Sql, transaction } from '../connect.ts';

export interface EndpointRow {
  id: string;
  account_id: string;
  url: string;
  description: string;
  event_types: string[];
  status: 'active' | 'disabled';
  disabled_reason: string | null;
  disabled_at: Date | null;
  secret_ciphertext: Uint8Array;
  failure_streak: number;
  created_at: Date;
  updated_at: Date;
}

export async function insertEndpoint(
  sql: Sql,
  e: { id: string; accountId: string; url: string; description: string; eventTypes: string[]; secret: Uint8Array },
): Promise<EndpointRow> {
  const rows = await sql<EndpointRow[]>`
    INSERT INTO webhook_endpoints (id, account_id, url, description, event_types, secret_ciphertext)
    VALUES (${e.id}, ${e.accountId}, ${e.url}, ${e.description}, ${e.eventTypes}, ${e.secret})
    RETURNING *`;
  return rows[0] as EndpointRow;
}

/** The account's endpoints, oldest first. */
export async function listEndpoints(sql: Sql, accountId: string): Promise<EndpointRow[]> {
  return sql<EndpointRow[]>`SELECT * FROM webhook_endpoints WHERE account_id = ${accountId} ORDER BY id`;
}

export async function getEndpoint(sql: Sql, accountId: string, id: string): Promise<EndpointRow | undefined> {
  const rows = await sql<EndpointRow[]>`SELECT * FROM webhook_endpoints WHERE account_id = ${accountId} AND id = ${id}`;
  return rows[0];
}

export interface EndpointChange {
  url?: string;
  description?: string;
  eventTypes?: string[];
  secret?: Uint8Array;
  /** `active` also clears the reason and resets the failure count (a resume). */
  status?: 'active' | 'disabled';
  disabledReason?: string;
}

/** Writes the fields given; undefined when the account has no such endpoint. */
export async function updateEndpoint(
  sql: Sql,
  accountId: string,
  id: string,
  c: EndpointChange,
): Promise<EndpointRow | undefined> {
  const status =
    c.status === 'active'
      ? sql`, status = 'active', disabled_reason = NULL, disabled_at = NULL, failure_streak = 0`
      : c.status === 'disabled'
        ? sql`, status = 'disabled', disabled_reason = ${c.disabledReason ?? null},
              disabled_at = CASE WHEN status = 'disabled' THEN disabled_at ELSE now() END`
        : sql``;
  const rows = await sql<EndpointRow[]>`
    UPDATE webhook_endpoints SET updated_at = now()
      ${c.url === undefined ? sql`` : sql`, url = ${c.url}`}
      ${c.description === undefined ? sql`` : sql`, description = ${c.description}`}
      ${c.eventTypes === undefined ? sql`` : sql`, event_types = ${c.eventTypes}`}
      ${c.secret === undefined ? sql`` : sql`, secret_ciphertext = ${c.secret}`}
      ${status}
    WHERE account_id = ${accountId} AND id = ${id}
    RETURNING *`;
  return rows[0];
}

/** False when the account has no such endpoint. Its jobs and deliveries go with it. */
export async function deleteEndpoint(sql: Sql, accountId: string, id: string): Promise<boolean> {
  const rows = await sql`DELETE FROM webhook_endpoints WHERE account_id = ${accountId} AND id = ${id} RETURNING id`;
  return rows.length === 1;
}

/** Accounts with at least one active endpoint: the tenants whose logs a webhook consumer reads. */
export async function tenantsWithEndpoints(sql: Sql): Promise<string[]> {
  const rows = await sql<{ account_id: string }[]>`
    SELECT DISTINCT account_id FROM webhook_endpoints WHERE status = 'active' ORDER BY account_id`;
  return rows.map((r) => r.account_id);
}

export async function activeEndpoints(sql: Sql, accountId: string): Promise<Pick<EndpointRow, 'id' | 'event_types'>[]> {
  return sql<Pick<EndpointRow, 'id' | 'event_types'>[]>`
    SELECT id, event_types FROM webhook_endpoints WHERE account_id = ${accountId} AND status = 'active'`;
}

/** Agent and parent of the account's conversations among `ids` (missing ones are left out). */
export async function conversationFacts(
  sql: Sql,
  accountId: string,
  ids: string[],
): Promise<{ id: string; agent_id: string; parent_id: string | null }[]> {
  if (ids.length === 0) return [];
  return sql<{ id: string; agent_id: string; parent_id: string | null }[]>`
    SELECT id, agent_id, parent_id FROM conversations WHERE account_id = ${accountId} AND id = ANY(${ids})`;
}

export interface JobInsert {
  id: string;
  accountId: string;
  endpointId: string;
  eventId: string;
  eventType: string;
  /** When the event happened, ISO 8601 to the microsecond (timestamptz keeps all six digits). */
  eventAt: string;
  data: Record<string, unknown>;
  maxAttempts: number;
  due: Date;
}

/**
 * Inserts jobs, skipping any whose (endpoint, event) already has one, so a consumer that sees
 * an event twice never doubles its delivery. Resolves to how many were new. (`event_at` goes
 * as text: the driver's own timestamptz parameter would pass through a Date, which keeps only
 * milliseconds.)
 */
export async function insertJobs(sql: Sql, jobs: JobInsert[]): Promise<number> {
  if (jobs.length === 0) return 0;
  let inserted = 0;
  for (const j of jobs) {
    const rows = await sql`
      INSERT INTO webhook_jobs (id, account_id, endpoint_id, event_id, event_type, event_at, data, max_attempts,
                                next_attempt_at)
      VALUES (${j.id}, ${j.accountId}, ${j.endpointId}, ${j.eventId}, ${j.eventType}, ${j.eventAt}::text::timestamptz,
              ${sql.json(j.data as postgres.JSONValue)}, ${j.maxAttempts}, ${j.due})
      ON CONFLICT (endpoint_id, event_id) DO NOTHING
      RETURNING id`;
    inserted += rows.length;
  }
  return inserted;
}

/** A claimed job with what sending it needs. */
export interface ClaimedJob {
  id: string;
  account_id: string;
  endpoint_id: string;
  event_id: string;
  event_type: string;
  /** ISO 8601, UTC, always six fractional digits (the payload's `created_at`). */
  event_at: string;
  data: Record<string, unknown>;
  attempts: number;
  max_attempts: number;
  manual: boolean;
  url: string;
  secret_ciphertext: Uint8Array;
  /** The conversation's status now (null for a test event or a conversation gone since). */
  conversation_status: string | null;
}

/**
 * Claims up to `limit` due jobs (pending, `next_attempt_at` passed, no live lease) of active
 * endpoints for `leaseUntil`, at most `perEndpoint` in flight per endpoint counting leases
 * other workers hold, so one slow receiver never takes every slot. Rows another transaction
 * is claiming are skipped (`FOR UPDATE SKIP LOCKED`): concurrent workers never claim one job
 * twice. (Two claims racing may each see the other's endpoint slots free and go one over
 * `perEndpoint` together; never more.) An expired lease (its worker died) is claimed again.
 */
export async function claimDueJobs(
  sql: Sql,
  now: Date,
  leaseUntil: Date,
  limit: number,
  perEndpoint: number,
): Promise<ClaimedJob[]> {
  if (limit <= 0) return [];
  return transaction(sql, async (tx) => {
    // Per active endpoint, its free slots (in flight counted up to the bound only) and that
    // many of its due jobs, each found through the endpoint's own index range: the cost of a
    // claim follows the number of endpoints, not the backlog.
    const due = await tx<{ id: string }[]>`
      SELECT id FROM webhook_jobs WHERE id IN (
        SELECT j.id FROM webhook_endpoints e
        CROSS JOIN LATERAL (
          SELECT count(*)::int AS n FROM (
            SELECT 1 FROM webhook_jobs x
            WHERE x.endpoint_id = e.id AND x.claimed_until IS NOT NULL AND x.state = 'pending'
              AND x.claimed_until > ${now}
            LIMIT ${perEndpoint}) held
        ) busy
        CROSS JOIN LATERAL (
          SELECT x.id, x.next_attempt_at FROM webhook_jobs x
          WHERE x.endpoint_id = e.id AND x.state = 'pending' AND x.next_attempt_at <= ${now}
            AND (x.claimed_until IS NULL OR x.claimed_until <= ${now})
          ORDER BY x.next_attempt_at LIMIT greatest(${perEndpoint} - busy.n, 0)
        ) j
        WHERE e.status = 'active'
        ORDER BY j.next_attempt_at LIMIT ${limit})
      FOR UPDATE SKIP LOCKED`;
    if (due.length === 0) return [];
    return tx<ClaimedJob[]>`
      UPDATE webhook_jobs j SET claimed_until = ${leaseUntil}
      FROM webhook_endpoints e
      WHERE j.id = ANY(${due.map((d) => d.id)}) AND e.id = j.endpoint_id
      RETURNING j.id, j.account_id, j.endpoint_id, j.event_id, j.event_type,
        to_char(j.event_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS event_at, j.data, j.attempts,
        j.max_attempts, j.manual, e.url, e.secret_ciphertext,
        (SELECT c.status FROM conversations c
          WHERE c.account_id = j.account_id AND c.id = j.data->>'conversation_id') AS conversation_status`;
  });
}

export interface AttemptOutcome {
  deliveryId: string;
  /** The status the receiver answered, or null when none came. */
  statusCode: number | null;
  accepted: boolean;
  durationMs: number;
  detail: string;
  at: Date;
  /** When to try again; null when this was the last attempt (or it was accepted). */
  retryAt: Date | null;
}

/**
 * Records one attempt of a claimed job in one transaction: the delivery row, the job's next
 * step (delivered, failed for good, or due again at `retryAt`, its lease released), and the
 * endpoint's failure count: reset by an accepted delivery, raised when an event (not a manual
 * redelivery) exhausts its retries. The endpoint is disabled, with `disableReason`, when the
 * count reaches `disableAfter`; resolves to true when this attempt disabled it.
 */
export async function recordAttempt(
  sql: Sql,
  job: Pick<ClaimedJob, 'id' | 'account_id' | 'endpoint_id' | 'attempts' | 'manual'>,
  o: AttemptOutcome,
  disableAfter: number,
  disableReason: string,
): Promise<{ disabled: boolean }> {
  return transaction(sql, async (tx) => {
    const attempt = job.attempts + 1;
    await tx`
      INSERT INTO webhook_deliveries (id, account_id, endpoint_id, job_id, attempt, status_code, duration_ms, detail,
                                      created_at)
      VALUES (${o.deliveryId}, ${job.account_id}, ${job.endpoint_id}, ${job.id}, ${attempt}, ${o.statusCode},
              ${o.durationMs}, ${o.detail}, ${o.at})`;
    const state = o.accepted ? 'delivered' : o.retryAt === null ? 'failed' : 'pending';
    await tx`
      UPDATE webhook_jobs SET attempts = ${attempt}, state = ${state}, claimed_until = NULL,
        next_attempt_at = coalesce(${o.retryAt}, next_attempt_at)
      WHERE id = ${job.id}`;
    if (o.accepted) {
      await tx`UPDATE webhook_endpoints SET failure_streak = 0 WHERE id = ${job.endpoint_id} AND failure_streak <> 0`;
      return { disabled: false };
    }
    if (state !== 'failed' || job.manual) return { disabled: false };
    const [row] = await tx<{ failure_streak: number; status: string }[]>`
      UPDATE webhook_endpoints SET failure_streak = failure_streak + 1 WHERE id = ${job.endpoint_id}
      RETURNING failure_streak, status`;
    if (row?.status !== 'active' || row.failure_streak < disableAfter) return { disabled: false };
    await tx`
      UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = ${disableReason}, disabled_at = ${o.at},
        updated_at = now()
      WHERE id = ${job.endpoint_id}`;
    return { disabled: true };
  });
}

export interface DeliveryRow {
  id: string;
  event_id: string;
  event_type: string;
  attempt: number;
  status_code: number | null;
  duration_ms: number;
  detail: string;
  created_at: Date;
}

/** The endpoint's attempts, newest first, `limit + 1` of them so the caller knows there are more. */
export async function listDeliveries(
  sql: Sql,
  accountId: string,
  endpointId: string,
  o: { limit: number; before?: string | undefined },
): Promise<DeliveryRow[]> {
  return sql<DeliveryRow[]>`
    SELECT d.id, j.event_id, j.event_type, d.attempt, d.status_code, d.duration_ms, d.detail, d.created_at
    FROM webhook_deliveries d JOIN webhook_jobs j ON j.id = d.job_id
    WHERE d.account_id = ${accountId} AND d.endpoint_id = ${endpointId}
      ${o.before === undefined ? sql`` : sql`AND d.id < ${o.before}`}
    ORDER BY d.id DESC LIMIT ${o.limit + 1}`;
}

/**
 * Sends the event of delivery `deliveryId` again at `now`, to the endpoint's URL and secret as
 * they are when it is sent. An event whose retries are under way is just due now and keeps
 * the retries it has left; a finished one (delivered, or out of attempts) gets one manual
 * attempt, whose failure is not retried and does not count toward disabling. Undefined when the
 * endpoint has no such delivery.
 */
export async function requeueDelivery(
  sql: Sql,
  accountId: string,
  endpointId: string,
  deliveryId: string,
  now: Date,
): Promise<{ event_id: string; event_type: string } | undefined> {
  const rows = await sql<{ event_id: string; event_type: string }[]>`
    UPDATE webhook_jobs j SET next_attempt_at = ${now},
      manual = CASE WHEN j.state = 'pending' THEN j.manual ELSE true END,
      max_attempts = CASE WHEN j.state = 'pending' THEN j.max_attempts ELSE j.attempts + 1 END,
      state = 'pending'
    FROM webhook_deliveries d
    WHERE d.id = ${deliveryId} AND d.account_id = ${accountId} AND d.endpoint_id = ${endpointId} AND j.id = d.job_id
    RETURNING j.event_id, j.event_type`;
  return rows[0];
}

/**
 * Deletes deliveries recorded before `before` (SPEC: rows pruned after 30 days), then finished
 * jobs created before it that have no delivery row left: a job still pending stays, and so
 * does an old job with a recent attempt (a redelivery), whose row would otherwise go with it.
 * Resolves to how many rows went.
 */
export async function pruneBefore(sql: Sql, before: Date): Promise<number> {
  const deliveries = await sql`DELETE FROM webhook_deliveries WHERE created_at < ${before}`;
  const jobs = await sql`
    DELETE FROM webhook_jobs j WHERE j.created_at < ${before} AND j.state <> 'pending'
      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.job_id = j.id)`;
  return deliveries.count + jobs.count;
}
