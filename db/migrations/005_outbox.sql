-- Producers and durability (DESIGN.md "The event log").
--
-- Every stored event remembers which producer emitted it and under which number, and each
-- producer's highest durable number is kept per tenant: the copier moves it in the same
-- transaction that stores the events, so after Redis loses its data a producer's mark is
-- loaded from here and a resend of what is already durable stays a no-op.
--
-- Events the service itself emits (`conversations`, `team` and `schedule` changes, later
-- stage events and turn results) go into the outbox in the same transaction as the state
-- change that causes them; a relay appends them to the log as the producer `outbox`. Each
-- tenant's outbox numbers come from a counter row updated in that transaction, so numbers
-- commit in order (a later number never commits before an earlier one) and have no holes.

ALTER TABLE log_events ALTER COLUMN conversation_id DROP NOT NULL;
ALTER TABLE log_events ADD COLUMN producer text;
ALTER TABLE log_events ADD COLUMN seq bigint;

CREATE TABLE log_producer_marks (
  account_id   text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  producer     text NOT NULL,
  durable_seq  bigint NOT NULL,
  PRIMARY KEY (account_id, producer)
);

CREATE TABLE log_outbox_counters (
  account_id  text PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
  last_seq    bigint NOT NULL
);

CREATE TABLE log_outbox (
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  seq              bigint NOT NULL,
  conversation_id  text,
  turn_id          text,
  kind             text NOT NULL,
  stream           text NOT NULL,
  data             text,
  stage            text,
  state            text,
  duration_ms      integer,
  created_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, seq)
);
