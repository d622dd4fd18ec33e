-- Running turns are looked up on a timer (turns whose runner is not heard from any more) and
-- when a runner goes: a partial index keeps that to the few running rows, not every turn.

CREATE INDEX turns_running_idx ON turns (created_at) WHERE state = 'running';
