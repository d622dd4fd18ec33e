import type { Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { Config } from '../config.ts';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { EventLog } from '../log/log.ts';
import type { Mailer } from '../mail/mail.ts';
import type { RequestMetrics, ServiceMetrics } from '../metrics.ts';
import type { Keyring } from '../secrets/keyring.ts';
import type { AccountDeps } from '../services/accounts.ts';
import type { Billing } from '../services/billing.ts';
import type { CredentialCache } from '../services/credential-cache.ts';
import type { ExportFiles } from '../services/exports.ts';
import type { InferenceCheckDeps } from '../services/inference-credentials.ts';
import type { LaunchDeps } from '../services/launch-deps.ts';
import type { ReadinessDeps } from '../services/readiness.ts';
import type { RetireSandboxesBuiltOn } from '../services/sandboxes.ts';
import type { TeamMcpDeps } from '../services/team-mcp.ts';

/** What the api role's routes are given by the composition root. */
export interface ApiDeps {
  config: Config;
  sql: Sql;
  log: Logger;
  mailer: Mailer;
  keyring: Keyring;
  /** Live keys and sessions this node remembers; every change to an account's credentials forgets them. */
  credentialCache: CredentialCache;
  /** The public base URL (known once the edge is bound). */
  publicUrl: () => string;
  accounts: AccountDeps;
  inference: InferenceCheckDeps;
  /** Whether the payment provider is configured (billing routes; `comped` on identity). */
  paymentEnabled: boolean;
  /** Billing and credits; null while payment is off. */
  billing: Billing | null;
  /** The event log (hot tail); reads below it go to Postgres through readLog. */
  eventLog: EventLog;
  /** The seam that retires persistent sandboxes whose identity changed (services/sandboxes.ts). */
  retireSandboxes: RetireSandboxesBuiltOn;
  /** The runner fabric's sessions (its transport is the edge's, or the api role's alone). */
  fabric: RunnerFabric;
  /** What starting a conversation needs (sandbox providers, the fabric, secrets, redaction). */
  launch: LaunchDeps;
  /** What `/api/ready` checks. */
  readiness: ReadinessDeps;
  /** Where answered requests are counted, and what `/metrics` serves. */
  metrics: RequestMetrics & Pick<ServiceMetrics, 'scrape'>;
  /** Where account export files are kept (built by the export worker, served by download). */
  exportFiles: ExportFiles;
  /** The team MCP server's tools: the team's operations and the process's turn waiters. */
  teamMcp: TeamMcpDeps;
  /**
   * Called once a route has queued webhook delivery jobs (a test, a redelivery): wakes this
   * process's delivery worker so they go now rather than at its next poll.
   */
  webhookJobsQueued: () => void;
}
