import { newId, orNotFound, RUNNER_CLOSE } from '@svc/core';
import { outbox, runners, type Sql, sandboxes, transaction } from '@svc/db';
import { RUNNER_TOKEN_PREFIX, runnerOnline } from '../fabric/presence.ts';
import { hashSecret, newSecret } from '../secrets/tokens.ts';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';
import { settleRunnerSandboxes } from './sandboxes.ts';
import { stageEvent } from './stage-events.ts';
import { changed } from './tenant-events.ts';

export function shapeRunner(row: runners.RunnerRow, offlineAfterMs: number, now = Date.now()) {
  return {
    id: row.id,
    name: row.name,
    hostname: row.hostname,
    online: runnerOnline(row.connected, row.last_seen_at, offlineAfterMs, now),
    path: row.path,
    version: row.version,
    last_seen: row.last_seen_at?.toISOString() ?? null,
    created_at: row.created_at.toISOString(),
  };
}

export async function createRunner(sql: Sql, who: ActorRef, name: string) {
  const token = newSecret(RUNNER_TOKEN_PREFIX);
  const row = await runners.insertRunner(sql, {
    id: newId('rnr'),
    accountId: who.accountId,
    name,
    tokenHash: hashSecret(token),
    tokenPrefix: token.slice(0, 12),
  });
  await recordAudit(sql, who, 'runner.created', { type: 'runner', id: row.id }, { name });
  return { row, token };
}

/**
 * Deletes the runner (its token stops working) and closes its connection on whichever node
 * holds it (`fabric.disconnectEverywhere`). A runner deleted while connected drops: its owner's
 * `team` event is written with the delete (the closed connection finds no row to change). Its
 * sandboxes are `failed` with it, and each live conversation on one hears so (stage `reattach`
 * failed).
 */
export async function deleteRunner(
  sql: Sql,
  /** The runner fabric's side this needs (RunnerFabric). */
  fabric: { disconnectEverywhere(who: { runnerId: string }, code: number, reason: string): Promise<void> },
  who: ActorRef,
  id: string,
) {
  await transaction(sql, async (tx) => {
    // Its sandboxes' machines go with it: their next prompt builds them on another runner, or
    // is 409 `no_runner_online` at once, not 503 for ever.
    const failed = await sandboxes.failOnRunner(tx, id);
    const deleted = orNotFound(await runners.deleteRunner(tx, who.accountId, id), 'Runner');
    if (deleted.connected) await outbox.enqueue(tx, who.accountId, [changed('team')]);
    for (const { row, conversations } of failed) {
      if (conversations.length === 0) continue;
      await outbox.enqueue(
        tx,
        row.account_id,
        conversations.map((conversationId) => stageEvent(conversationId, null, 'reattach', 'failed', RUNNER_DELETED)),
      );
    }
  });
  await fabric.disconnectEverywhere({ runnerId: id }, RUNNER_CLOSE.revoked, 'this runner was deleted by its owner');
  await recordAudit(sql, who, 'runner.deleted', { type: 'runner', id });
}

/** What a conversation hears when its sandbox's runner is deleted. */
const RUNNER_DELETED =
  'Its runner was deleted, and the sandbox with it. The next prompt builds it again from the start on another runner of the account (409 no_runner_online while none is online).';

/** How many silent runners one presence pass records gone at most; the next pass takes the rest. */
const SILENT_BATCH = 100;

/**
 * The owner's watchers hear of a change of their own runner's connection (`team`, written with
 * the change); runners the instance starts for local sandboxes are not the owner's machines.
 */
async function tellOwner(tx: Sql, change: runners.ConnectionChange | undefined): Promise<void> {
  if (change?.kind === 'self') await outbox.enqueue(tx, change.account_id, [changed('team')]);
}

/**
 * Records an accepted connection of the runner with a new epoch, and in the same transaction
 * the owner's `team` event and its sandboxes it no longer holds (settleRunnerSandboxes: a
 * restart of it). Returns the epoch; who holds the token when another process's
 * connection is live (heard from within `liveWithinMs`: nothing is recorded then); undefined
 * when the runner was deleted.
 */
export async function recordConnected(
  sql: Sql,
  runnerId: string,
  hello: Parameters<typeof runners.connected>[2],
  liveWithinMs: number,
  /** What the runner holds and keeps (its hello): its other sandboxes are settled with it. */
  sandboxesOf: { held: string[]; kept: string[] } = { held: [], kept: [] },
): Promise<number | runners.TokenTaken | undefined> {
  return transaction(sql, async (tx) => {
    const change = await runners.connected(tx, runnerId, hello, liveWithinMs);
    if (change && 'taken' in change) return change;
    await tellOwner(tx, change);
    if (change) await settleRunnerSandboxes(tx, runnerId, sandboxesOf.held, sandboxesOf.kept);
    return change?.epoch;
  });
}

/**
 * Records that the connection `epoch` ended, compare-and-set (`runners.disconnected`), with the
 * owner's `team` event in the same transaction: however many nodes record one end, the row
 * changes and the event is written once. With `silentForMs`, only while the connection has
 * been silent that long. Resolves to whether this call recorded it.
 */
export async function recordDisconnected(
  sql: Sql,
  runnerId: string,
  epoch: number,
  opts: { silentForMs?: number } = {},
): Promise<boolean> {
  return transaction(sql, async (tx) => {
    const change = await runners.disconnected(tx, runnerId, epoch, opts);
    await tellOwner(tx, change);
    return change !== undefined;
  });
}

/**
 * A drop nobody closed (the runner's process or machine died silently, or the node holding its
 * connection did): every runner recorded connected that no heartbeat reached for `silentForMs`
 * is recorded disconnected at the epoch it was seen at (`recordDisconnected`), so a runner that
 * reconnected or was heard from meanwhile is left alone. Any number of nodes may run it at
 * once. Resolves to how many it recorded.
 */
export async function recordSilentRunnersGone(sql: Sql, silentForMs: number): Promise<number> {
  let recorded = 0;
  for (const r of await runners.silentSince(sql, silentForMs, SILENT_BATCH)) {
    if (await recordDisconnected(sql, r.id, r.epoch, { silentForMs })) recorded++;
  }
  return recorded;
}
