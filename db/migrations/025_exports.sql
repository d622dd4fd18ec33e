-- Account exports: a gzipped JSON file of every resource of the account and its whole event
-- log, built in the background by the export worker under DATA_DIR/exports/<account>/<id>.json.gz.
-- `status` is `pending` while it builds, then `ready` (the file is complete and downloadable)
-- or `failed` after too many attempts. The worker claims a row with a lease (`claimed_until`)
-- and a claim number (`attempts`): progress and completion are written only under the claim
-- that holds it, so a worker whose lease passed to another can no longer mark anything.
-- At most one pending export per account (the partial unique index keeps two racing requests
-- from both starting one).

CREATE TABLE exports (
  id              text PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'ready', 'failed')),
  events_written  bigint NOT NULL DEFAULT 0,
  bytes           bigint,
  attempts        integer NOT NULL DEFAULT 0,
  claimed_until   timestamptz,
  error           text,
  created_at      timestamptz NOT NULL DEFAULT now(),
  completed_at    timestamptz,
  updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX exports_by_account ON exports (account_id, created_at DESC);
CREATE UNIQUE INDEX exports_one_pending ON exports (account_id) WHERE status = 'pending';
