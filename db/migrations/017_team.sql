-- The team roster: one row per agent of an account on the team, with its custom name (null
-- keeps the agent's name) and its live conversation on the team channel. The agent's earlier
-- team conversations stay on the channel as its history; leaving the team unbinds them.

CREATE TABLE teammates (
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  agent_id         text NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
  name             text,
  conversation_id  text REFERENCES conversations (id) ON DELETE SET NULL,
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, agent_id)
);

-- An agent's team history (its conversations on the channel) and the roster's usage sums.
CREATE INDEX conversations_channel_idx ON conversations (account_id, channel_id, agent_id) WHERE channel_id IS NOT NULL;
