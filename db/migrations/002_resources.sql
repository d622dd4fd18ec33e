-- Resources a tenant defines before a conversation: environments, vaults, their secrets,
-- agents and agent avatars. Names are unique per account (bulk apply upserts by name).

CREATE TABLE environments (
  id                 text PRIMARY KEY,
  account_id         text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  name               text NOT NULL,
  packages           jsonb NOT NULL DEFAULT '{}'::jsonb,
  env_vars           jsonb NOT NULL DEFAULT '{}'::jsonb,
  repositories       jsonb NOT NULL DEFAULT '[]'::jsonb,
  setup_script       text NOT NULL DEFAULT '',
  networking_type    text NOT NULL DEFAULT 'unrestricted',
  networking_config  jsonb,
  created_at         timestamptz NOT NULL DEFAULT now(),
  updated_at         timestamptz NOT NULL DEFAULT now(),
  UNIQUE (account_id, name)
);

CREATE TABLE environment_secrets (
  id              text PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  environment_id  text NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
  key             text NOT NULL,
  ciphertext      bytea NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now(),
  UNIQUE (environment_id, key)
);

CREATE TABLE vaults (
  id          text PRIMARY KEY,
  account_id  text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  name        text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (account_id, name)
);

CREATE TABLE vault_secrets (
  id          text PRIMARY KEY,
  account_id  text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  vault_id    text NOT NULL REFERENCES vaults (id) ON DELETE CASCADE,
  key         text NOT NULL,
  ciphertext  bytea NOT NULL,
  expires_at  timestamptz,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (vault_id, key)
);

-- An agent needs its environment: deleting an environment that agents use is refused by the
-- service (409), and the foreign key keeps that true for a racing delete. NO ACTION (checked at
-- the end of the statement) rather than RESTRICT, so erasing the account cascades cleanly.
CREATE TABLE agents (
  id                       text PRIMARY KEY,
  account_id               text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  name                     text NOT NULL,
  description              text NOT NULL DEFAULT '',
  system                   text NOT NULL DEFAULT '',
  runtime                  text NOT NULL,
  model                    text NOT NULL,
  environment_id           text NOT NULL REFERENCES environments (id),
  skills                   jsonb NOT NULL DEFAULT '[]'::jsonb,
  mcp_servers              jsonb NOT NULL DEFAULT '{}'::jsonb,
  sandbox_provider         text,
  sandbox_mode             text NOT NULL DEFAULT 'ephemeral',
  allowed_vault_ids        text[],
  allowed_environment_ids  text[],
  permission_policy        jsonb NOT NULL DEFAULT '{"default": "auto_allow", "ask": []}'::jsonb,
  created_at               timestamptz NOT NULL DEFAULT now(),
  updated_at               timestamptz NOT NULL DEFAULT now(),
  UNIQUE (account_id, name)
);
CREATE INDEX agents_environment_idx ON agents (account_id, environment_id);

CREATE TABLE agent_avatars (
  agent_id    text PRIMARY KEY REFERENCES agents (id) ON DELETE CASCADE,
  account_id  text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  media_type  text NOT NULL,
  bytes       bytea NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now()
);
