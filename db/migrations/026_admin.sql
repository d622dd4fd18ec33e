-- Operator administration.
-- `accounts.sandbox_limit`: the admin-set number of active sandboxes for that account; null
-- means the instance default (SANDBOX_QUOTA_DEFAULT).
-- `admin_events`: the privilege trail, one row per admin action (who, what, to whom, when).
-- It names accounts by id only and has no account_id column: it is the instance's record, so
-- it outlives the admin and the target (deleting an account erases its rows, not the record
-- that an admin deleted it), and carries no email or content of either.

ALTER TABLE accounts ADD COLUMN sandbox_limit integer CHECK (sandbox_limit >= 0);

CREATE TABLE admin_events (
  id           bigserial PRIMARY KEY,
  admin_id     text NOT NULL,
  action       text NOT NULL,
  target_type  text NOT NULL,
  target_id    text NOT NULL,
  metadata     jsonb NOT NULL DEFAULT '{}',
  request_ip   text,
  created_at   timestamptz NOT NULL DEFAULT now()
);
