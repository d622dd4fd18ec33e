import { newId, orNotFound, RUNNER_CLOSE } from '@svc/core';
import { runners, type Sql } from '@svc/db';
import type { RunnerFabric } from '../fabric/fabric.ts';
import { hashSecret, newSecret } from '../secrets/tokens.ts';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';

/** Runner tokens are told apart from API keys by their prefix. */
export const RUNNER_TOKEN_PREFIX = 'svcr_';

/** Presence: a runner is online while connected and heard from within `offlineAfterMs`. */
export function runnerOnline(connected: boolean, lastSeenAt: Date | null, offlineAfterMs: number, now = Date.now()) {
  return connected && lastSeenAt !== null && now - lastSeenAt.getTime() < offlineAfterMs;
}

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
 * holds it (`fabric.disconnectEverywhere`).
 */
export async function deleteRunner(
  sql: Sql,
  fabric: Pick<RunnerFabric, 'disconnectEverywhere'>,
  who: ActorRef,
  id: string,
) {
  orNotFound(await runners.deleteRunner(sql, who.accountId, id), 'Runner');
  await fabric.disconnectEverywhere({ runnerId: id }, RUNNER_CLOSE.revoked, 'this runner was deleted by its owner');
  await recordAudit(sql, who, 'runner.deleted', { type: 'runner', id });
}
