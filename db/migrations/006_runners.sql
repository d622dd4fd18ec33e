-- Self-hosted runners (DESIGN.md "The runner fabric"). The owner registers one and gets its
-- token once; only the SHA-256 of the token is kept. What the runner says about itself in its
-- hello (hostname, root path, version, instance) is recorded at each connection, with the
-- connection's epoch: it increases with every accepted connection, and a state change made
-- for a connection names its epoch, so a replaced connection's late close changes nothing.

CREATE TABLE runners (
  id            text PRIMARY KEY,
  account_id    text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  name          text NOT NULL,
  token_hash    bytea NOT NULL UNIQUE,
  token_prefix  text NOT NULL,
  hostname      text,
  path          text,
  version       text,
  instance      text,
  epoch         integer NOT NULL DEFAULT 0,
  connected     boolean NOT NULL DEFAULT false,
  last_seen_at  timestamptz,
  created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX runners_account_idx ON runners (account_id, created_at);
