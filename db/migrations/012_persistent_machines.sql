-- One live persistent machine per identity (agent, environment, vault) of an account: two
-- persistent launches racing for it cannot both build one (the second gets 503 provisioning).

CREATE UNIQUE INDEX sandboxes_persistent_identity_idx
  ON sandboxes (account_id, agent_id, coalesce(environment_id, ''), coalesce(vault_id, ''))
  WHERE mode = 'persistent' AND status IN ('provisioning', 'ready', 'suspended');
