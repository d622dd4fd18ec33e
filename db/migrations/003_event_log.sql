-- The durable copy of the event log. Redis holds the hot tail; Postgres holds everything.
-- A worker copies each tenant's events in id order and records how far it got in the same
-- transaction (log_copy_marks), so after a crash it resumes exactly where it stopped.

CREATE TABLE log_events (
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  id               bigint NOT NULL,
  conversation_id  text NOT NULL,
  turn_id          text,
  kind             text NOT NULL,
  stream           text NOT NULL,
  data             text,
  stage            text,
  state            text,
  duration_ms      integer,
  ts               timestamptz NOT NULL,
  PRIMARY KEY (account_id, id)
);
CREATE INDEX log_events_conversation_idx ON log_events (account_id, conversation_id, id);

CREATE TABLE log_copy_marks (
  account_id  text PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
  copied_id   bigint NOT NULL
);
