-- The egress credential broker (DECISIONS "Sandboxes that hold").
-- secret_bindings: which secret, by name, the runner's proxy writes into which header of
-- requests to which host. No value is kept here: a binding applies to every environment and
-- vault of the account holding a secret of that name. `shape` is a preset's name (a JSON
-- string) or `{"header": ..., "format": ...}`.
-- egress_log: one row per request that left a sandbox through the broker, refused ones too;
-- never a path, query or body. Kept BROKER_LOG_RETENTION_HOURS after its conversation ends
-- (a sweep deletes older rows), and gone with the conversation.

CREATE TABLE secret_bindings (
  id           text PRIMARY KEY,
  account_id   text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  secret_name  text NOT NULL,
  host         text NOT NULL,
  shape        jsonb NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  updated_at   timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT secret_bindings_name_host_key UNIQUE (account_id, secret_name, host)
);

CREATE TABLE egress_log (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  conversation_id  text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
  at               timestamptz NOT NULL,
  host             text NOT NULL,
  port             integer NOT NULL,
  method           text NOT NULL,
  -- No foreign key: a row keeps naming the binding it used after the binding is deleted.
  binding_id       text,
  status           integer,
  latency_ms       integer,
  refused          boolean NOT NULL DEFAULT false,
  reason           text
);
-- Paging a conversation's rows newest first (`before` an id), and the sweep by conversation.
CREATE INDEX egress_log_conversation_idx ON egress_log (conversation_id, id DESC);
