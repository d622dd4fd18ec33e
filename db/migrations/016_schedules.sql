-- Schedules: cron routines that prompt an agent. `next_run_at` is null
-- while disabled; the scheduler claims rows whose `next_run_at` has passed. A claim is a lease
-- (`claimed_until`) with the id the run's conversation will get (`claim_conversation_id`), so a
-- worker that takes over an expired claim can tell whether the run already happened.

CREATE TABLE schedules (
  id                    text PRIMARY KEY,
  account_id            text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  agent_id              text NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
  name                  text NOT NULL DEFAULT '',
  cron                  text NOT NULL,
  prompt                text NOT NULL,
  one_off               boolean NOT NULL DEFAULT false,
  enabled               boolean NOT NULL DEFAULT true,
  next_run_at           timestamptz,
  last_run_at           timestamptz,
  last_conversation_id  text,
  last_error            text,
  claimed_until         timestamptz,
  claim_conversation_id text,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX schedules_by_agent ON schedules (account_id, agent_id);
CREATE INDEX schedules_due ON schedules (next_run_at) WHERE next_run_at IS NOT NULL;
