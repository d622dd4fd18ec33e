-- The machine behind a sandbox row. `incarnation` is the machine the sandbox should have;
-- `built_incarnation` the one its runner reported built (stage `sandbox` done). They differ
-- after a reset or a retirement: the machine was destroyed, the sandbox (its identity, its
-- conversations) stays `ready`, and the next prompt builds incarnation `incarnation` afresh.
ALTER TABLE sandboxes ADD COLUMN built_incarnation integer;
UPDATE sandboxes SET built_incarnation = incarnation WHERE status IN ('ready', 'suspended');

-- Quota and fleet counts look at live sandboxes only.
CREATE INDEX sandboxes_active_idx ON sandboxes (account_id) WHERE status IN ('provisioning', 'ready', 'suspended');
-- Conversations of a sandbox (its listing, the mid-turn check of a reset).
CREATE INDEX conversations_sandbox_idx ON conversations (sandbox_id) WHERE sandbox_id IS NOT NULL;
