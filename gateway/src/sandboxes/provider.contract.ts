import type { Test } from 'tap';
import type { SandboxProvider, SandboxRef } from './provider.ts';

/** What the contract needs around one adapter: a service it is wired into, and a way to hurt its machines. */
export interface ProviderFixture {
  provider: SandboxProvider;
  /** A new sandbox of this provider, as launch records it: `provisioning`, on the runner `place` chose. */
  newSandbox(): Promise<SandboxRef>;
  /** Whether a runner is connected to the fabric now. */
  isLive(runnerId: string): boolean;
  /** Ends a machine's runner-agent process abruptly (as a crash or a power cut does). */
  killMachine(runnerId: string): Promise<void>;
  /** Records the sandbox built on `runnerId`, as the end of its build does: `ready`. */
  built(sandbox: SandboxRef, runnerId: string): Promise<SandboxRef>;
  /** Whether the machine on `runnerId` has stopped the sandbox (its runtimes are gone). */
  stopped(sandboxId: string, runnerId: string): boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(check: () => boolean | Promise<boolean>, ms = 20_000): Promise<boolean> {
  for (let waited = 0; waited < ms; waited += 50) {
    if (await check()) return true;
    await sleep(50);
  }
  return check();
}

/**
 * What every SandboxProvider adapter must do (provider.ts), run against a real runner-agent
 * process: its machines connect over the fabric, a built machine is adopted as it is, health
 * follows the machine, destroy is idempotent, and a provider either suspends and wakes or
 * refuses to wake.
 */
export function sandboxProviderContract(t: Test, setup: () => Promise<ProviderFixture>) {
  t.test('place answers null or a connected runner of the account', async (t) => {
    const f = await setup();
    const sandbox = await f.newSandbox();
    t.ok(sandbox.runner_id === null || f.isLive(sandbox.runner_id), `placed on ${sandbox.runner_id}`);
  });

  t.test('create gives a connected runner; health is live and adopt keeps that runner', async (t) => {
    const f = await setup();
    const sandbox = await f.newSandbox();
    const runnerId = await f.provider.create(sandbox);
    t.ok(f.isLive(runnerId), 'the runner is connected');
    const built = { ...sandbox, status: 'ready' as const, runner_id: runnerId };
    t.equal(await f.provider.health(built), 'live');
    t.equal(await f.provider.adopt(built), runnerId, 'adopt answers the runner that holds it');
    t.equal(await f.provider.create(built), runnerId, 'a rebuild of a live machine stays on its runner');
  });

  t.test('a sandbox without a runner is not live', async (t) => {
    const f = await setup();
    const sandbox = { ...(await f.newSandbox()), runner_id: null };
    t.not(await f.provider.health(sandbox), 'live');
  });

  t.test('a machine whose runner-agent died is not live any more', async (t) => {
    const f = await setup();
    const sandbox = await f.newSandbox();
    const runnerId = await f.provider.create(sandbox);
    const built = { ...sandbox, status: 'ready' as const, runner_id: runnerId };
    await f.killMachine(runnerId);
    t.ok(await until(async () => (await f.provider.health(built)) !== 'live'), 'health follows the machine');
  });

  t.test('destroy is idempotent and the machine is no longer held by this node', async (t) => {
    const f = await setup();
    const sandbox = await f.newSandbox();
    const runnerId = await f.provider.create(sandbox);
    const built = { ...sandbox, status: 'ready' as const, runner_id: runnerId };
    await f.provider.destroy(built);
    await f.provider.destroy(built);
    t.notOk(
      f.provider.held().some((h) => h.sandboxId === sandbox.id),
      'not among the machines this node runs',
    );
  });

  t.test(
    'erasing an account after its sandboxes were destroyed leaves no machine of it, and may be repeated',
    async (t) => {
      const f = await setup();
      const sandbox = await f.newSandbox();
      const runnerId = await f.provider.create(sandbox);
      await f.provider.destroy({ ...sandbox, status: 'ready', runner_id: runnerId });
      await f.provider.eraseAccount(sandbox.account_id);
      await f.provider.eraseAccount(sandbox.account_id);
      t.notOk(
        f.provider.held().some((h) => h.sandboxId === sandbox.id),
        'nothing of the account is held here',
      );
    },
  );

  t.test('a provider that suspends stops the machine and wakes it; one that does not refuses to wake', async (t) => {
    const f = await setup();
    const sandbox = await f.newSandbox();
    const runnerId = await f.provider.create(sandbox);
    if (!f.provider.suspends) {
      t.same(await f.provider.suspendable(), [], 'none is ever idle-suspended');
      await t.rejects(f.provider.wake({ ...sandbox, status: 'suspended', runner_id: null }));
      return;
    }
    const built = await f.built(sandbox, runnerId);
    t.ok(
      (await f.provider.suspendable()).some((h) => h.sandboxId === sandbox.id && h.runnerId === runnerId),
      'a candidate of this node',
    );
    await f.provider.suspend(built, runnerId);
    t.ok(await until(() => f.stopped(sandbox.id, runnerId)), 'the machine stopped');
    t.equal(f.isLive(runnerId), f.provider.suspendKeepsRunner, 'its runner stays when the sandbox stays on it');
    const asleep = {
      ...built,
      status: 'suspended' as const,
      runner_id: f.provider.suspendKeepsRunner ? runnerId : null,
    };
    const woken = await f.provider.wake(asleep);
    t.ok(f.isLive(woken), 'woken on a connected runner');
    t.equal(await f.provider.health({ ...asleep, runner_id: woken }), 'live');
    await f.provider.destroy(asleep);
  });

  t.test('a machine that runs is never reported lost at start', async (t) => {
    const f = await setup();
    const sandbox = await f.newSandbox();
    const runnerId = await f.provider.create(sandbox);
    t.notOk((await f.provider.lostAtStart()).includes(runnerId));
  });

  t.test('a turn left adrift ends interrupted or failed, with words a user can act on', async (t) => {
    const f = await setup();
    t.ok(['interrupted', 'failed'].includes(f.provider.adrift.state));
    t.ok(f.provider.adrift.error.length > 10);
  });
}
