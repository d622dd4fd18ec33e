-- Conversations and turns as records. Their launch and execution come with the runner
-- fabric; here they are what is listed, read, marked read and deleted.

CREATE TABLE conversations (
  id              text PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  agent_id        text NOT NULL,
  title           text NOT NULL DEFAULT '',
  status          text NOT NULL DEFAULT 'idle' CHECK (status IN ('idle', 'running', 'terminated')),
  source          text NOT NULL DEFAULT 'ui' CHECK (source IN ('ui', 'agent')),
  parent_id       text REFERENCES conversations (id) ON DELETE SET NULL,
  sandbox_id      text,
  channel_id      text,
  environment_id  text,
  vault_id        text,
  last_active_at  timestamptz NOT NULL DEFAULT now(),
  last_read_at    timestamptz,
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX conversations_account_idx ON conversations (account_id, last_active_at DESC);
CREATE INDEX conversations_parent_idx ON conversations (account_id, parent_id);

CREATE TABLE turns (
  id               text PRIMARY KEY,
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  conversation_id  text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
  number           integer NOT NULL,
  prompt           text NOT NULL,
  origin           text NOT NULL DEFAULT 'user' CHECK (origin IN ('user', 'autonomous')),
  image_count      integer NOT NULL DEFAULT 0,
  state            text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed', 'interrupted', 'timeout')),
  usage            jsonb,
  created_at       timestamptz NOT NULL DEFAULT now(),
  ended_at         timestamptz,
  UNIQUE (conversation_id, number)
);
