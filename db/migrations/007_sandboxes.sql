-- Sandboxes: the machine a conversation's runtime runs on, built for an identity (agent,
-- environment, vault). On provider `runner` it lives on the tenant's runner (runner_id); on
-- `local` on a runner-agent the instance starts for it. `incarnation` counts rebuilds of the
-- machine: output is numbered per incarnation (its log producer is sbx:<id>:<incarnation>).

CREATE TABLE sandboxes (
  id              text PRIMARY KEY,
  account_id      text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
  provider        text NOT NULL CHECK (provider IN ('runner', 'local', 'sprites', 'e2b', 'daytona')),
  mode            text NOT NULL DEFAULT 'ephemeral' CHECK (mode IN ('ephemeral', 'persistent')),
  status          text NOT NULL DEFAULT 'provisioning'
                  CHECK (status IN ('provisioning', 'ready', 'suspended', 'terminated', 'failed')),
  runner_id       text REFERENCES runners (id) ON DELETE SET NULL,
  agent_id        text NOT NULL,
  environment_id  text,
  vault_id        text,
  incarnation     integer NOT NULL DEFAULT 0,
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sandboxes_account_idx ON sandboxes (account_id, created_at DESC);
CREATE INDEX sandboxes_runner_idx ON sandboxes (runner_id);
