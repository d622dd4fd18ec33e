-- How far each tenant's webhook consumer group has taken the log: every event at or below
-- consumed_id was handed to the webhook sink and the sink finished with it. The group itself
-- lives with the hot log (Redis, or memory on the embedded defaults); this mark lets a group
-- lost with it (Redis lost its data, a restart of the embedded defaults) resume from the
-- durable copy without skipping an event or repeating more than the last few.

CREATE TABLE webhook_consumer_marks (
  account_id   text PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
  consumed_id  bigint NOT NULL
);
