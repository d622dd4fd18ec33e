-- Why a failed turn failed, as `{code, message}` (a code of TURN_ERROR_CODES and words saying
-- what to fix); null for every other turn and for turns older than the column.

ALTER TABLE turns ADD COLUMN error jsonb;
