-- Support reports: what a tenant tells the operator (a bug, a stuck conversation, a question),
-- kept as the operator's inbox and forwarded by the worker to a code-host issue and/or the
-- support mailbox. `status` is `new` until forwarding ends, then `forwarded` or `failed`.
-- The forwarder claims a row with a lease (`claimed_until`); `attempts` counts its tries and
-- `next_attempt_at` holds back the next one. `issue_url` and `mailed_at` record each channel
-- that already succeeded, so a retry never opens a second issue or sends a second mail.

CREATE TABLE support_reports (
  id                     text PRIMARY KEY,
  account_id             text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  category               text NOT NULL CHECK (category IN ('bug', 'stuck', 'question', 'idea', 'other')),
  message                text NOT NULL,
  context                jsonb,
  client                 text,
  screenshot             bytea,
  screenshot_media_type  text,
  status                 text NOT NULL DEFAULT 'new' CHECK (status IN ('new', 'forwarded', 'failed')),
  attempts               integer NOT NULL DEFAULT 0,
  next_attempt_at        timestamptz NOT NULL DEFAULT now(),
  claimed_until          timestamptz,
  issue_url              text,
  mailed_at              timestamptz,
  forwarded_at           timestamptz,
  forward_error          text,
  created_at             timestamptz NOT NULL DEFAULT now(),
  updated_at             timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX support_reports_by_account ON support_reports (account_id, id DESC);
CREATE INDEX support_reports_pending ON support_reports (next_attempt_at) WHERE status = 'new';
