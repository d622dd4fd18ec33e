-- Full-text search over conversation titles, turn prompts and turn replies (SPEC "Search").
-- The `simple` configuration indexes exact tokens (lower-cased, no stemming, no stop words).
-- Each text gets a stored generated tsvector, so existing rows are indexed as the column is
-- added and every later write keeps it current; a GIN index on each serves `@@`. A reply is
-- null until its turn ends, and so is its vector: a running turn matches by prompt only.
-- Idempotent: every statement is a no-op when what it makes already exists.

ALTER TABLE conversations
  ADD COLUMN IF NOT EXISTS title_tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, title)) STORED;
ALTER TABLE turns
  ADD COLUMN IF NOT EXISTS prompt_tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, prompt)) STORED;
ALTER TABLE turns
  ADD COLUMN IF NOT EXISTS reply_tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, reply)) STORED;

-- Each index leads with the tenant (btree_gin lets a GIN index hold a plain column), so a
-- search reads only its own tenant's entries: on a vector alone, a common word would fetch
-- every tenant's matching rows and filter the others out one by one. btree_gin ships with
-- Postgres (a trusted extension: the database's owner may create it) and with PGlite.
CREATE EXTENSION IF NOT EXISTS btree_gin;
CREATE INDEX IF NOT EXISTS conversations_title_search_idx ON conversations USING gin (account_id, title_tsv);
CREATE INDEX IF NOT EXISTS turns_prompt_search_idx ON turns USING gin (account_id, prompt_tsv);
CREATE INDEX IF NOT EXISTS turns_reply_search_idx ON turns USING gin (account_id, reply_tsv);

-- Turns that ended before replies were stored (migration 013) have no reply and so match by
-- prompt only. The server fills them in once from the log (the reply backfill); this index
-- keeps its search for them to the few such rows, and it finds none once it has run.
CREATE INDEX IF NOT EXISTS turns_reply_missing_idx ON turns (ended_at) WHERE reply IS NULL AND state <> 'running';
