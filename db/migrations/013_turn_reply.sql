-- The reply text of a turn (its agent messages joined), stored when the turn ends so search
-- can index it without reading the log.

ALTER TABLE turns ADD COLUMN reply text;
