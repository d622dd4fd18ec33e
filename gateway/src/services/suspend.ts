import { outbox, type Sql, sandboxes } from '@svc/db';
import type { Logger } from 'pino';
import type { SandboxProvider, SandboxProviders } from '../sandboxes/provider.ts';
import type { OutboxRelay } from '../workers/outbox-relay.ts';
import { recordAudit } from './audit.ts';
import { stageEvent } from './stage-events.ts';

export interface SuspendDeps {
  sql: Sql;
  providers: SandboxProviders;
  relay: OutboxRelay;
  logger: Logger;
}

/**
 * Suspends the idle sandboxes whose machine this node runs or whose runner is connected here,
 * of the providers that suspend: each one that is `ready`, has no conversation mid-turn and
 * saw no turn for `idleMs` moves to `suspended` (compare-and-set under the same locks as a
 * reset, so two nodes or a turn starting at that moment never race it), then its machine is
 * stopped while its directory, the disk, is kept: a `local` sandbox's runner-agent is stopped
 * gracefully (its runtimes stop with it); a tenant's runner stays connected and stops the
 * sandbox's runtimes (`sandbox.suspend`). Each live conversation on it gets stage `suspend`
 * done, and an audit row says so. The next prompt, or a launch attaching to it, wakes it
 * (launch.ts, stage `reattach`). Returns how many were suspended; 0 when `idleMs` is 0 (never
 * suspend).
 */
export async function suspendIdleSandboxes(deps: SuspendDeps, idleMs: number): Promise<number> {
  if (idleMs <= 0) return 0;
  let suspended = 0;
  const candidates: { provider: SandboxProvider; held: { sandboxId: string; runnerId: string } }[] = [];
  for (const provider of deps.providers.all.filter((p) => p.suspends)) {
    for (const held of await provider.suspendable()) candidates.push({ provider, held });
  }
  for (const { provider, held } of candidates) {
    const idleSince = new Date(Date.now() - idleMs);
    const keepRunner = provider.suspendKeepsRunner;
    const done = await sandboxes.suspendIfIdle(deps.sql, held.sandboxId, idleSince, { keepRunner });
    if (!done) continue;
    suspended++;
    const { row, conversations } = done;
    await provider.suspend(row, held.runnerId).catch((err: Error) =>
      // Its runner went away meanwhile: the wake starts the sandbox's runtimes afresh anyway.
      deps.logger.warn({ err: { message: err.message }, sandbox: row.id }, 'suspended machine not told to stop'),
    );
    const data = JSON.stringify({
      idle_ms: idleMs,
      ...(keepRunner ? { runtimes: 'stopped', runner: 'connected' } : { runner_agent: 'stopped' }),
      disk: 'kept',
      wake: 'the next prompt wakes it (stage reattach); its runtime session starts afresh',
    });
    if (conversations.length) {
      await deps.sql.begin((tx) =>
        outbox.enqueue(
          tx as unknown as Sql,
          row.account_id,
          conversations.map((conversationId) => stageEvent(conversationId, null, 'suspend', 'done', data)),
        ),
      );
      await deps.relay.flush(row.account_id);
    }
    await recordAudit(
      deps.sql,
      { accountId: row.account_id, actor: 'system', ip: null },
      'sandbox.suspended',
      { type: 'sandbox', id: row.id },
      { idle_ms: idleMs, conversations: conversations.length },
    );
    deps.logger.info({ sandbox: row.id, provider: provider.name }, 'idle sandbox suspended');
  }
  return suspended;
}
