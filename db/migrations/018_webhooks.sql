-- Webhooks: endpoints a tenant registers, one delivery job per (endpoint, event), and one row
-- per delivery attempt. Jobs are claimed by delivery workers on any node with FOR UPDATE SKIP
-- LOCKED and a lease (`claimed_until`), so a worker that dies mid-request loses nothing: the
-- lease expires and another worker sends the job again (at least once).

CREATE TABLE webhook_endpoints (
  id                text PRIMARY KEY,
  account_id        text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  url               text NOT NULL,
  description       text NOT NULL DEFAULT '',
  event_types       text[] NOT NULL,
  status            text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
  disabled_reason   text,
  disabled_at       timestamptz,
  -- AES-256-GCM under the account's data key; never returned after create and rotate.
  secret_ciphertext bytea NOT NULL,
  -- Events in a row whose retries were exhausted; an accepted delivery resets it.
  failure_streak    integer NOT NULL DEFAULT 0,
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_account_idx ON webhook_endpoints (account_id, id);

CREATE TABLE webhook_jobs (
  id               text PRIMARY KEY,
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  endpoint_id      text NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
  -- The log event id as text (the payload's `id`), or `test_...` for a webhook.test.
  event_id         text NOT NULL,
  event_type       text NOT NULL,
  event_at         timestamptz NOT NULL,
  -- The payload's `data` without `status`, which is read when the job is sent.
  data             jsonb NOT NULL,
  attempts         integer NOT NULL DEFAULT 0,
  max_attempts     integer NOT NULL,
  -- A redelivery asked for by the tenant: one attempt, not counted toward disabling.
  manual           boolean NOT NULL DEFAULT false,
  state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
  next_attempt_at  timestamptz NOT NULL,
  claimed_until    timestamptz,
  created_at       timestamptz NOT NULL DEFAULT now(),
  UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_jobs_due_idx ON webhook_jobs (endpoint_id, next_attempt_at) WHERE state = 'pending';
-- Leases under way, counted per endpoint against its bound (a finished attempt clears its lease).
CREATE INDEX webhook_jobs_leased_idx ON webhook_jobs (endpoint_id) WHERE claimed_until IS NOT NULL;
CREATE INDEX webhook_jobs_created_idx ON webhook_jobs (created_at);

CREATE TABLE webhook_deliveries (
  id           text PRIMARY KEY,
  account_id   text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  endpoint_id  text NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
  job_id       text NOT NULL REFERENCES webhook_jobs (id) ON DELETE CASCADE,
  attempt      integer NOT NULL,
  status_code  integer,
  duration_ms  integer NOT NULL,
  detail       text NOT NULL,
  created_at   timestamptz NOT NULL
);
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, id DESC);
CREATE INDEX webhook_deliveries_created_idx ON webhook_deliveries (created_at);
