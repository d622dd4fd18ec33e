import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { Redaction } from '../log/log.append.ts';
import type { EventLog } from '../log/log.ts';
import type { Billing } from './billing.ts';
import { recordPermissionStage } from './permissions.ts';
import { sandboxBuilt } from './sandboxes.ts';
import { failTurnsOfRunner, finishTurn, openAutonomousTurn, reattached } from './turns.ts';

/** What the fabric reports about runners, as the fabric's constructor takes it. */
type RunnerEventHandlers = Pick<
  ConstructorParameters<typeof RunnerFabric>[0],
  'onTurnEnd' | 'onRunnerGone' | 'onReattach' | 'onSandboxBuilt' | 'onPermissionStage' | 'onAutonomousTurn'
>;

/**
 * What the service does with what runners report over the fabric: a turn's end is recorded
 * (once, with why it failed), a runner gone past its grace fails its running turns, a runner that reconnects
 * holding sandboxes gets their turns reattached, a build's end moves its sandbox to `ready` or
 * `failed`, a permission request is on record before its event reaches a client, and so is an
 * autonomous turn a runner opened (its end is a turn's end like any other). Each is
 * idempotent, since the fabric may report again after a resend.
 */
export function runnerEventHandlers(deps: {
  sql: Sql;
  log: EventLog;
  logger: Logger;
  /** This node's write path's redaction: a turn's error is stored redacted like its log. */
  redaction: Pick<Redaction, 'secretsOf'>;
  /** Turn charges at turn end; null while payment is off. */
  billing: Billing | null;
}): RunnerEventHandlers {
  return {
    onTurnEnd: (tenant, turnId, result, usage, error) => finishTurn(deps, tenant, turnId, result, usage, error),
    onRunnerGone: (runnerId) => failTurnsOfRunner(deps.sql, runnerId),
    onReattach: (runnerId, sandboxIds) => reattached(deps.sql, runnerId, sandboxIds),
    onSandboxBuilt: (sandboxId, incarnation, ok) => sandboxBuilt(deps.sql, sandboxId, incarnation, ok),
    onPermissionStage: (tenant, event) => recordPermissionStage(deps, tenant, event),
    onAutonomousTurn: (tenant, conversationId, turnId) => openAutonomousTurn(deps, tenant, conversationId, turnId),
  };
}
