import { SANDBOX_PROVIDERS, validationFailed } from '@svc/core';
import type { sandboxes } from '@svc/db';

/** The sandbox as a provider sees it: its row (identity, incarnation, status, current runner). */
export type SandboxRef = Pick<
  sandboxes.SandboxRow,
  'id' | 'account_id' | 'provider' | 'status' | 'runner_id' | 'incarnation'
>;

/**
 * Whether a sandbox's machine can serve it now:
 * - `live`: its runner-agent is connected (on some node) and takes commands;
 * - `lost`: its machine is gone for good (a local runner-agent that exited, for example after
 *   a restart of the service): the next turn builds a new incarnation;
 * - `away`: its machine may still exist on a runner that is not connected now: a turn on it
 *   waits for the runner (503 `runner_offline`), a rebuild goes to another runner.
 */
export type MachineHealth = 'live' | 'lost' | 'away';

/** How a turn that nothing will end any more (its runner unheard of past the grace) ends. */
export interface AdriftTurnEnd {
  state: 'interrupted' | 'failed';
  /** For the turn's log and `error`, in words a user can act on. */
  error: string;
  /** The audit row's reason. */
  reason: 'service_restarted' | 'runner_gone' | 'runner_restarted';
}

/**
 * A sandbox provider: where a sandbox's machine (a running `runner-agent` with a one-sandbox
 * token, or a tenant's own runner) comes from. Every machine speaks to the service over the
 * runner fabric, so what a provider does ends once a runner id serves the sandbox: building,
 * turns and output go through the fabric the same way for every provider. Services never ask
 * which provider a sandbox has; what differs lives here. Every adapter passes
 * `provider.contract.ts`.
 */
export interface SandboxProvider {
  /** The name stored on the sandbox and named by an agent's `sandbox_provider`. */
  readonly name: string;
  /**
   * Whether the service suspends its idle machines (runtimes stopped, disk kept). A sandbox of
   * any provider is also suspended when its runner comes back without its machine but with its
   * directory (a restart of the runner), and is woken by `wake`.
   */
  readonly suspends: boolean;
  /**
   * Whether a suspended sandbox stays on its runner: a tenant's runner outlives the machine,
   * keeps the disk and is where the wake adopts it. Else the runner goes with the machine (a
   * runner-agent of the sandbox's own) and the sandbox is suspended on none.
   */
  readonly suspendKeepsRunner: boolean;
  /** Whether a sandbox's wire shape names the tenant runner it lives on (`runner`). */
  readonly showsRunner: boolean;
  /** How a turn ends that its runner left adrift (see `endTurnsAdrift`). */
  readonly adrift: AdriftTurnEnd;
  /**
   * How long `create` or `wake` may take to have a machine connected before it gives up
   * (rejecting, which ends the turn). A turn whose sandbox is still provisioning with no
   * runner is not counted adrift sooner: its start is under way, and ends it either way.
   */
  readonly startTimeoutMs: number;

  /**
   * The runner a new sandbox (or a rebuild whose machine is away) is placed on, or null when
   * `create` makes the machine itself. Rejects with 409 `no_runner_online` when the provider
   * places on tenant runners and none is online.
   */
  place(accountId: string): Promise<string | null>;
  /** Whether the sandbox's machine can serve it now (see MachineHealth). Never rejects. */
  health(sandbox: SandboxRef): Promise<MachineHealth>;
  /**
   * A machine for a sandbox about to be built (a new sandbox or its next incarnation):
   * resolves to the id of a runner that is connected and takes `sandbox.create` for it.
   * Rejects with 503 `runner_offline` when no machine could be had; nothing is left running
   * then.
   */
  create(sandbox: SandboxRef): Promise<string>;
  /**
   * The machine of a built sandbox, for its next turn: resolves to the connected runner that
   * holds it. Rejects with 503 `runner_offline` when it has none.
   */
  adopt(sandbox: SandboxRef): Promise<string>;
  /**
   * Starts a suspended sandbox's machine again on its kept disk: resolves to the connected
   * runner that then adopts it (`sandbox.create` with `adopt`): a new machine of the provider's
   * own, or the runner the disk is on (503 `runner_offline` when it has none).
   */
  wake(sandbox: SandboxRef): Promise<string>;
  /**
   * Stops the sandbox's machine and keeps its disk (the sandbox is already `suspended` in
   * the database); resolves once it has stopped, or once its runner was told to stop it. Only
   * `runnerId`'s machine of this incarnation is stopped, so a machine started for the sandbox
   * meanwhile is left alone.
   */
  suspend(sandbox: Pick<SandboxRef, 'id' | 'incarnation'>, runnerId: string): Promise<void>;
  /**
   * The sandbox's machine is gone for good, or its disk is to be wiped (terminate, reset of a
   * suspended sandbox): stops what the provider runs for it and removes what it keeps. The
   * runner, when one is connected, is told `sandbox.destroy` by the caller first. Idempotent.
   */
  destroy(sandbox: SandboxRef): Promise<void>;
  /**
   * The account was deleted and each of its sandboxes destroyed: removes whatever the provider
   * still keeps for it (spooled output, directories of sandboxes it no longer knew). Idempotent.
   */
  eraseAccount(accountId: string): Promise<void>;
  /** The machines this node runs itself, by sandbox. */
  held(): { sandboxId: string; runnerId: string }[];
  /**
   * The machines this node can suspend, by sandbox (the idle-suspend worker's candidates,
   * each checked for idleness before it is suspended): none when the provider does not
   * suspend.
   */
  suspendable(): Promise<{ sandboxId: string; runnerId: string }[]>;
  /**
   * Called once, a few seconds after the service starts: the runners of machines this node ran
   * before it started again whose process is gone and that have not reconnected (a power cut
   * takes a node's own machines along). Their running turns end at once instead of after the
   * grace. A machine that survived is not reported. Each is reported once.
   */
  lostAtStart(): Promise<string[]>;
}

/** The providers of this instance, chosen by the composition root. */
export class SandboxProviders {
  private readonly byName: Map<string, SandboxProvider>;

  constructor(
    providers: SandboxProvider[],
    /** The provider of agents that name none (SANDBOX_PROVIDER_DEFAULT). */
    readonly defaultName: string,
  ) {
    this.byName = new Map(providers.map((p) => [p.name, p]));
    if (!this.byName.has(defaultName)) throw new Error(`the default sandbox provider ${defaultName} is not offered`);
  }

  /** Every provider this instance offers. */
  get all(): SandboxProvider[] {
    return [...this.byName.values()];
  }

  /** The names an agent's `sandbox_provider` may take on this instance (GET /api/catalog). */
  get nameable(): string[] {
    return this.all.map((p) => p.name).filter((n) => (SANDBOX_PROVIDERS as readonly string[]).includes(n));
  }

  /** The provider of a stored sandbox (one this instance made). */
  of(name: string): SandboxProvider {
    const provider = this.byName.get(name);
    if (!provider) throw new Error(`sandbox provider ${name} is not offered by this instance`);
    return provider;
  }

  /**
   * The provider an agent's `sandbox_provider` names (null: the instance default). 422
   * `validation_failed` on `sandbox_provider` when this instance does not offer it, so an
   * agent is refused when saved, not when it launches.
   */
  forAgent(name: string | null): SandboxProvider {
    const provider = this.byName.get(name ?? this.defaultName);
    if (!provider) {
      const offered = this.nameable;
      throw validationFailed(
        {
          sandbox_provider: [
            `${name} is not offered by this instance; it offers ${offered.length ? offered.join(', ') : 'none'} (or null for the default)`,
          ],
        },
        `Sandbox provider ${name} is not offered by this instance.`,
      );
    }
    return provider;
  }
}
