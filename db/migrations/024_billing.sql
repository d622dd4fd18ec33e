-- The credit ledger: every movement of an account's credit, in cents, appended and never
-- edited. The balance is the sum of an account's rows. `kind` says what moved it: `grant`
-- (an operator's gift, positive), `purchase` (a credit pack the payment provider confirmed,
-- positive) or `turn` (a turn's metered time, negative). A turn is charged once (`turn_id`
-- unique) and a provider event moves the balance once (`provider_event_id` unique), however
-- often either is reported. `turn_id` is not a foreign key: a charge outlives the deletion
-- of its conversation. `turn_ms` is the metered time a `turn` row charged for.

CREATE TABLE credit_ledger (
  id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  account_id         text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  kind               text NOT NULL CHECK (kind IN ('grant', 'purchase', 'turn')),
  cents              bigint NOT NULL,
  turn_id            text UNIQUE,
  turn_ms            bigint,
  provider_event_id  text UNIQUE,
  note               text,
  created_at         timestamptz NOT NULL DEFAULT now(),
  CHECK ((kind = 'turn') = (turn_id IS NOT NULL))
);

CREATE INDEX credit_ledger_by_account ON credit_ledger (account_id, created_at);
