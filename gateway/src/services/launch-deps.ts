import type { Runtime } from '@svc/core';
import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { Redaction } from '../log/log.append.ts';
import type { EventLog } from '../log/log.ts';
import type { SandboxProviders } from '../sandboxes/provider.ts';
import type { Keyring } from '../secrets/keyring.ts';
import type { OutboxRelay } from '../workers/outbox-relay.ts';
import type { Billing } from './billing.ts';
import type { SandboxLimits } from './sandboxes.ts';

/**
 * What the conversation lifecycle needs (launch.ts, dispatch.ts, runtime-env.ts, turns and the
 * team's messages): its own module, so the files that take it import none of each other for it.
 */
export interface LaunchDeps {
  sql: Sql;
  keyring: Keyring;
  fabric: RunnerFabric;
  redaction: Redaction;
  logger: Logger;
  /** The command line that starts each runtime's ACP agent on the runner (RUNTIME_<NAME>_COMMAND). */
  runtimeCommands: Record<Runtime, string>;
  turnTimeLimitMs: number;
  /** The runtime's quiet time that ends an autonomous turn (AUTONOMOUS_IDLE_MS). */
  autonomousIdleMs: number;
  /** The log, to store the reply of an autonomous turn a prompt ends. */
  log: EventLog;
  /** An unanswered permission request is denied after this long (PERMISSION_TIMEOUT_S). */
  permissionTimeoutMs: number;
  /** Where sandboxes' machines come from, by provider (and the default for agents naming none). */
  providers: SandboxProviders;
  relay: OutboxRelay;
  /** The service's base URL as a sandbox's runtime reaches it (SVC_API_URL). */
  apiUrl: () => string;
  limits: SandboxLimits;
  /** Credit gate and turn charges; null while payment is off (nothing gated or charged). */
  billing: Billing | null;
  /**
   * The base URL of each model provider's API by the provider part of a model name
   * (`anthropic`, `openai`, `google`: ANTHROPIC_BASE_URL, OPENAI_BASE_URL, GEMINI_BASE_URL):
   * an egress allowlist always lets the runtime reach its provider.
   */
  providerUrls: Record<string, string>;
  /**
   * EGRESS_BROKER is on: bound secrets and the inference credential reach sandboxes as
   * placeholders, and the runner's broker writes them into requests to their hosts.
   */
  broker: boolean;
}
