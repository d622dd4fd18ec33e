-- The secret values of a conversation's sandboxes, kept for redacting its output.
-- A turn's launch adds its values (environment and vault secrets, the inference credential,
-- the turn's sandbox token) before its runtime starts; the node whose write path appends the
-- conversation's output reads them from here when it did not launch the turn itself. One
-- AES-256-GCM ciphertext of the JSON array of every value registered so far, under the
-- account's data key: a token minted for an earlier turn stays valid until the conversation
-- ends, so it stays redacted too. Gone with the conversation.
-- `held`: what the conversation's redactors held back (the end of a chunk that could start a
-- value) when the process holding them stopped, sealed the same way; the next write path that
-- loads the values takes it, so the text is neither lost nor written twice.

CREATE TABLE conversation_secrets (
  conversation_id  text PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
  account_id       text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  sealed           bytea NOT NULL,
  held             bytea,
  updated_at       timestamptz NOT NULL DEFAULT now()
);
