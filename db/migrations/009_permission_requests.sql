-- Permission requests (SPEC launch rule 5, "States and transitions"). The runner names each
-- request it makes wait and reports it in the log; the service records it here as `pending`.
-- It is resolved once: the first answer over the API wins by compare-and-set on status, and
-- the runner's report of how it ended (answered, timeout, turn end, interrupt) is recorded as
-- the final word. Requests the policy answers at once are only in the log.

CREATE TABLE permission_requests (
  id               text NOT NULL,
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  conversation_id  text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
  turn_id          text REFERENCES turns (id) ON DELETE CASCADE,
  options          jsonb NOT NULL,
  status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'resolved')),
  resolution       text CHECK (resolution IN ('answered', 'policy', 'timeout', 'turn_end', 'interrupted')),
  option_id        text,
  created_at       timestamptz NOT NULL DEFAULT now(),
  resolved_at      timestamptz,
  PRIMARY KEY (account_id, id)
);
CREATE INDEX permission_requests_pending_idx ON permission_requests (account_id, turn_id) WHERE status = 'pending';
