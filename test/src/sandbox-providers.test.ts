import { newId } from '@svc/core';
import { sandboxes } from '@svc/db';
import t, { type Test } from 'tap';
import type { ProviderFixture } from '../../gateway/src/sandboxes/provider.contract.ts';
import { sandboxProviderContract } from '../../gateway/src/sandboxes/provider.contract.ts';
import type { SandboxRef } from '../../gateway/src/sandboxes/provider.ts';
import { signUp, startTestService, type TestService } from './harness.ts';
import { startRunnerProcess } from './runner-process.ts';

const ENV = { RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '3000' };

/** An account with an environment and an agent on `provider`, and a way to record its sandboxes. */
async function account(t: Test, svc: TestService, provider: 'local' | 'runner') {
  const me = await signUp(svc);
  const token = me.key;
  const env = (await svc.http.post('/api/environments', { token, body: { name: 'main' } })).body;
  const agent = (
    await svc.http.post('/api/agents', {
      token,
      body: {
        name: 'coder',
        runtime: 'claude',
        model: 'anthropic/claude-sonnet-4-5',
        environment_id: env.id,
        sandbox_provider: provider === 'local' ? null : provider,
      },
    })
  ).body;
  t.ok(agent.id, JSON.stringify(agent));
  const p = svc.providers.of(provider);
  const newSandbox = async () => {
    const row = await sandboxes.insertSandbox(svc.db.sql, {
      id: newId('sbx'),
      accountId: me.accountId,
      provider,
      mode: 'ephemeral',
      runnerId: await p.place(me.accountId),
      agentId: agent.id,
      environmentId: env.id,
      vaultId: null,
    });
    if (!row) throw new Error('sandbox not recorded');
    return row;
  };
  const built = async (sandbox: SandboxRef, runnerId: string): Promise<SandboxRef> => {
    await sandboxes.setRunner(svc.db.sql, sandbox.id, runnerId);
    await sandboxes.markBuilt(svc.db.sql, sandbox.id, sandbox.incarnation);
    return { ...sandbox, status: 'ready', runner_id: runnerId };
  };
  return { me, token, provider: p, newSandbox, built };
}

t.test('sandbox provider contract: local (a runner-agent child per sandbox)', async (t) => {
  const svc = await startTestService(t, { env: ENV });
  sandboxProviderContract(t, async (): Promise<ProviderFixture> => {
    const a = await account(t, svc, 'local');
    return {
      provider: a.provider,
      newSandbox: a.newSandbox,
      isLive: (id) => svc.fabric.isLive(id),
      killMachine: async (runnerId) => {
        const pid = svc.local.held().find((h) => h.runnerId === runnerId)?.pid;
        if (pid) process.kill(pid, 'SIGKILL');
      },
      built: a.built,
      // Its runner-agent is the machine.
      stopped: (_sandboxId, runnerId) => !svc.fabric.isLive(runnerId),
    };
  });
});

t.test('sandbox provider contract: runner (the tenant’s own svc-runner)', async (t) => {
  const svc = await startTestService(t, { env: ENV });
  sandboxProviderContract(t, async (): Promise<ProviderFixture> => {
    const a = await account(t, svc, 'runner');
    const runner = (await svc.http.post('/api/runners', { token: a.token, body: { name: 'box' } })).body;
    const process_ = await startRunnerProcess(t, svc.url, runner.token);
    return {
      provider: a.provider,
      newSandbox: a.newSandbox,
      isLive: (id) => svc.fabric.isLive(id),
      killMachine: async () => {
        process_.child.kill('SIGKILL');
      },
      built: a.built,
      stopped: (sandboxId) => process_.output.includes(`sandbox ${sandboxId} suspended`),
    };
  });
});
