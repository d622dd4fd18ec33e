-- The images sent with a prompt, addressed by zero-based position within their turn
-- (GET /api/conversations/:id/turns/:turn_id/images/:position answers the raw bytes).

CREATE TABLE turn_images (
  account_id  text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  turn_id     text NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
  position    integer NOT NULL CHECK (position >= 0),
  media_type  text NOT NULL,
  data        bytea NOT NULL,
  PRIMARY KEY (turn_id, position)
);
