-- Foundation: accounts, credentials of every kind, one-time tokens, OAuth codes, audit.
-- Every tenant-owned table carries account_id and cascades from accounts, so deleting an
-- account removes every row it owns; queries still filter on account_id explicitly.

CREATE TABLE accounts (
  id                       text PRIMARY KEY,
  email                    text NOT NULL,
  password_hash            text NOT NULL,
  role                     text NOT NULL DEFAULT 'user' CHECK (role IN ('user', 'admin')),
  email_verified_at        timestamptz,
  session_version          integer NOT NULL DEFAULT 1,
  onboarding_state         text NOT NULL DEFAULT 'new',
  onboarding_completed_at  timestamptz,
  comped                   boolean NOT NULL DEFAULT false,
  brokered                 boolean NOT NULL DEFAULT false,
  suspended                boolean NOT NULL DEFAULT false,
  data_key                 bytea NOT NULL,
  created_at               timestamptz NOT NULL DEFAULT now(),
  updated_at               timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX accounts_email_key ON accounts (lower(email));

-- API keys, OAuth-issued keys and sandbox tokens: 256-bit random values stored as SHA-256.
CREATE TABLE api_keys (
  id               text PRIMARY KEY,
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  kind             text NOT NULL CHECK (kind IN ('api', 'oauth', 'sandbox')),
  name             text NOT NULL,
  prefix           text NOT NULL,
  token_hash       bytea NOT NULL UNIQUE,
  scope            text NOT NULL CHECK (scope IN ('full', 'standard', 'conversation')),
  conversation_id  text,
  client_id        text,
  session_version  integer,
  created_at       timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz,
  last_used_at     timestamptz,
  revoked_at       timestamptz
);
CREATE INDEX api_keys_account_idx ON api_keys (account_id, created_at DESC);

-- Browser sessions (cookie). Valid while session_version matches the account's.
CREATE TABLE sessions (
  id               text PRIMARY KEY,
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  token_hash       bytea NOT NULL UNIQUE,
  session_version  integer NOT NULL,
  created_at       timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz NOT NULL
);
CREATE INDEX sessions_account_idx ON sessions (account_id);

-- Single-use emailed tokens: verification, password reset, email change.
CREATE TABLE auth_tokens (
  id          text PRIMARY KEY,
  account_id  text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  purpose     text NOT NULL CHECK (purpose IN ('verify', 'reset', 'email_change')),
  token_hash  bytea NOT NULL UNIQUE,
  new_email   text,
  created_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL,
  used_at     timestamptz
);
CREATE INDEX auth_tokens_account_idx ON auth_tokens (account_id, purpose);

CREATE TABLE oauth_codes (
  code_hash       bytea PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  client_id       text NOT NULL,
  redirect_uri    text NOT NULL,
  code_challenge  text NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  expires_at      timestamptz NOT NULL,
  used_at         timestamptz
);
CREATE INDEX oauth_codes_account_idx ON oauth_codes (account_id);

-- Inference credentials: AES-256-GCM under the account's data key; never returned.
CREATE TABLE inference_credentials (
  account_id  text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  provider    text NOT NULL,
  ciphertext  bytea NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, provider)
);

-- Append-only: no route updates or deletes a row; only erasure of the whole account does.
CREATE TABLE audit_events (
  id             bigserial PRIMARY KEY,
  account_id     text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  inserted_at    timestamptz NOT NULL DEFAULT now(),
  actor          text NOT NULL CHECK (actor IN ('ui', 'api', 'sprite', 'system')),
  action         text NOT NULL,
  resource_type  text,
  resource_id    text,
  metadata       jsonb NOT NULL DEFAULT '{}'::jsonb,
  request_ip     text
);
CREATE INDEX audit_events_account_idx ON audit_events (account_id, id DESC);
