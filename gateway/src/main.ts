import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import {
  accounts,
  consumerMarks,
  conversations,
  type Database,
  logEvents,
  migrate,
  openDatabase,
  outbox,
} from '@svc/db';
import pino, { type Logger } from 'pino';
import { exemptList } from './addresses.ts';
import { buildApi } from './api/app.ts';
import type { ApiDeps } from './api/deps.ts';
import { type Config, publicUrl } from './config.ts';
import { startEdge } from './edge/edge.ts';
import { createForwarder } from './edge/forward.ts';
import { RunnerFabric } from './fabric/fabric.ts';
import { redisRunnerRouter } from './fabric/router.redis.ts';
import { memoryInvalidations } from './invalidation/invalidation.memory.ts';
import { redisInvalidations } from './invalidation/invalidation.redis.ts';
import { githubIssues } from './issues/issues.github.ts';
import { memoryConsumerGroups } from './log/consumer.memory.ts';
import { redisConsumerGroups } from './log/consumer.redis.ts';
import { type AppendEvents, createAppender, Redaction } from './log/log.append.ts';
import { memoryEventLog } from './log/log.memory.ts';
import { redisEventLog } from './log/log.redis.ts';
import type { EventLog } from './log/log.ts';
import { fileMailer } from './mail/mail.file.ts';
import { smtpMailer } from './mail/mail.smtp.ts';
import type { Mailer } from './mail/mail.ts';
import { type MetricsSnapshot, ServiceMetrics } from './metrics.ts';
import { stripePayments } from './payments/payments.stripe.ts';
import { lockDataDir, portInUse, portTaken } from './processes/in-use.ts';
import { type EdgeProcesses, freePort, startEdgeProcesses } from './processes/supervisor.ts';
import { admission } from './ratelimit/admission.ts';
import { memoryRateLimiter } from './ratelimit/ratelimit.memory.ts';
import { redisRateLimiter } from './ratelimit/ratelimit.redis.ts';
import type { RateLimiter } from './ratelimit/ratelimit.ts';
import { connectRedis, type RedisConnections } from './redis.ts';
import { LocalSandboxes } from './sandboxes/provider.local.ts';
import { runnerProvider } from './sandboxes/provider.runner.ts';
import { SandboxProviders } from './sandboxes/provider.ts';
import { Keyring } from './secrets/keyring.ts';
import { masterKey } from './secrets/master-key.ts';
import type { Billing } from './services/billing.ts';
import { conversationSecretStore } from './services/conversation-secrets.ts';
import { CredentialCache } from './services/credential-cache.ts';
import { ExportFiles } from './services/exports.ts';
import type { LaunchDeps } from './services/launch-deps.ts';
import { backfillReplies } from './services/reply-backfill.ts';
import { runnerEventHandlers } from './services/runner-events.ts';
import { type RetireSandboxesBuiltOn, retireSandboxesBuiltOn } from './services/sandboxes.ts';
import { listTeammates, messageTeammate, type TeamDeps } from './services/team.ts';
import type { TeamOps } from './services/team-mcp.ts';
import { TurnWaiters } from './services/turn-waiters.ts';
import { enqueueWebhookJobs, tenantsWithEndpoints } from './services/webhook-jobs.ts';
import { StreamServer } from './streams/streams.ts';
import { systemResolver } from './webhooks/transport.ts';
import { EgressLogSweeper } from './workers/egress-log-sweep.ts';
import { ExportBuilder } from './workers/export-builder.ts';
import { IdleSuspendWorker } from './workers/idle-suspend.ts';
import { LogCopier } from './workers/log-copier.ts';
import { LostMachinesWorker } from './workers/lost-machines.ts';
import { OutboxRelay } from './workers/outbox-relay.ts';
import { RunnerPresenceWorker } from './workers/runner-presence.ts';
import { SchedulerWorker } from './workers/scheduler.ts';
import { SupportForwarder } from './workers/support-forwarder.ts';
import { TurnsAdriftWorker } from './workers/turns-adrift.ts';
import { defaultConsumerName, WebhookConsumer } from './workers/webhook-consumer.ts';
import { WebhookDeliveryWorker } from './workers/webhook-delivery.ts';

/** pino with every credential-bearing path redacted (CONVENTIONS 8). */
export function createLogger(level: Config['LOG_LEVEL']): Logger {
  return pino({
    level,
    redact: {
      paths: [
        'req.headers.authorization',
        'req.headers.cookie',
        'headers.authorization',
        'headers.cookie',
        '*.password',
        '*.token',
        '*.value',
        '*.secret',
        '*.key',
        'password',
        'token',
        'value',
        'secret',
      ],
      censor: '[REDACTED]',
    },
  });
}

export interface Service {
  url: string;
  port: number;
  config: Config;
  db: Database;
  mailer: Mailer;
  keyring: Keyring;
  log: Logger;
  /** The keys and sessions this node remembers (authentication reads through it). */
  credentialCache: CredentialCache;
  /** The event log, its single write path, and the registry of values to redact. */
  eventLog: EventLog;
  appendEvents: AppendEvents;
  redaction: Redaction;
  copier: LogCopier;
  relay: OutboxRelay;
  fabric: RunnerFabric;
  /** The local sandbox provider's runner-agent children. */
  local: LocalSandboxes;
  /** The sandbox providers this instance offers. */
  providers: SandboxProviders;
  /** What starting a conversation needs (the scheduler's runs use it too). */
  launch: LaunchDeps;
  /** This process's metrics (`GET /metrics`). */
  metrics: ServiceMetrics;
  /** With EDGE_PROCESSES > 1, the other processes serving this port; else undefined. */
  edgeProcesses: EdgeProcesses | undefined;
  /** The process's one registry of waits for turns to end (the team MCP server's `wait_for_teammate`). */
  turnWaiters: TurnWaiters;
  /** Every route the api role registered (for the OpenAPI coverage test). */
  routes: readonly { method: string; url: string; hidden: boolean }[];
  close(): Promise<void>;
}

/** Seams a test may replace, and what an edge process is told by its group; a plain start passes none. */
export interface ServiceOverrides {
  retireSandboxes?: RetireSandboxesBuiltOn;
  /** Which of EDGE_PROCESSES this process is (0, the default, for the first): a metrics label. */
  edgeProcess?: number;
  /** For a process other than the first: every process's metrics, gathered by the first. */
  gatherMetrics?: () => Promise<MetricsSnapshot[]>;
  /** This process joins the port of its EDGE_PROCESSES group, which the group's first process checked. */
  joinsGroupPort?: boolean;
}

/**
 * V8 settings of every process that runs the service. Allocation-site pretenuring is off: it
 * judges an allocation site by how many of its objects survived while the process filled up
 * (watchers and runners connecting, caches warming) and from then on allocates that site's
 * objects straight in the old generation. It did so for the sites of the per-event path
 * (frames, appends, replies), whose objects live for milliseconds: under a steady 1,000
 * events/s fan-out the old generation grew 1.3 MB/s of such garbage and a major GC (10 to
 * 20 ms, a stall of every delivery) came every few seconds. Without it the old generation grew
 * 0.1 MB/s and no major GC ran in 30 s (bench sse-fanout, --trace-gc). Set at start, before
 * the service allocates anything of its own.
 */
function tuneHeap(): void {
  setFlagsFromString('--no-allocation-site-pretenuring');
}

/** The team core's operations, as the team MCP server's tools take them. */
function teamOps(deps: TeamDeps): TeamOps {
  return {
    listTeammates: (who) => listTeammates(deps, who),
    messageTeammate: (who, agentId, message) => messageTeammate(deps, who, agentId, message),
  };
}

/**
 * The composition root: chooses adapters from configuration (Postgres or the embedded one, Redis or
 * memory, SMTP or file mail), builds the api role, and puts the edge in front of it. Every
 * role runs in this one process.
 */
export async function startService(
  config: Config,
  log: Logger = createLogger(config.LOG_LEVEL),
  overrides: ServiceOverrides = {},
): Promise<Service> {
  tuneHeap();
  const cleanups: (() => Promise<unknown> | unknown)[] = [];
  let closing: Promise<void> | undefined;
  // Idempotent: a second call waits for the first shutdown instead of closing twice.
  const closeAll = () => {
    closing ??= (async () => {
      for (const fn of cleanups.reverse()) await fn();
    })();
    return closing;
  };
  // Children stop alongside this process's own shutdown, and are waited for last.
  let childrenStopped: Promise<void> | undefined;
  cleanups.push(() => childrenStopped);
  try {
    // A port held by another instance fails the start at once, before anything is opened. (The
    // listen itself is the race-free check: exclusive, or probed first for a group.)
    if (config.PORT !== 0 && !overrides.joinsGroupPort && (await portTaken(config.HOST, config.PORT))) {
      throw await portInUse(config.HOST, config.PORT);
    }
    // The embedded database on disk serves one process; a second would split its writes.
    if (!config.DATABASE_URL) {
      const lock = await lockDataDir(config.DATA_DIR, log);
      cleanups.push(() => lock.release());
    }
    const key = await masterKey(config, log);
    const keyring = new Keyring(key);
    if (
      !config.DATABASE_URL &&
      existsSync(join(config.DATA_DIR, 'pglite')) &&
      !existsSync(join(config.DATA_DIR, 'postgres'))
    ) {
      log.warn(
        { dir: resolve(config.DATA_DIR, 'pglite') },
        'the embedded database is PostgreSQL now (DATA_DIR/postgres); what an earlier version stored with PGlite in DATA_DIR/pglite is not carried over',
      );
    }
    const db = await openDatabase({
      url: config.DATABASE_URL,
      dataDir: config.DATA_DIR,
      max: config.DATABASE_POOL_MAX,
      log: log.child({ role: 'postgres' }),
    });
    cleanups.push(() => db.close());
    const applied = await migrate(db.sql);
    if (applied.length) log.info({ applied }, 'migrations applied');
    const promoted = await accounts.promoteAdmins(db.sql, config.ADMIN_EMAILS);
    if (promoted.length) log.info({ accounts: promoted }, 'ADMIN_EMAILS: existing accounts made admin');

    // One server or, with REDIS_CLUSTER, a cluster; checked (version, eviction) before use.
    let redis: RedisConnections | undefined;
    if (config.REDIS_URL) {
      const connections = await connectRedis(config, log.child({ role: 'redis' }));
      cleanups.push(() => connections.close());
      redis = connections;
    }

    // Keys and sessions this node resolved, forgotten on every node when an account's change.
    const credentialCache = new CredentialCache({
      ttlMs: config.AUTH_CACHE_TTL_MS,
      maxEntries: 10_000,
      invalidations: redis
        ? redisInvalidations({
            redis: redis.redis,
            subscriber: redis.subscriber,
            prefix: config.REDIS_KEY_PREFIX,
            logger: log.child({ role: 'credentials' }),
          })
        : memoryInvalidations(),
    });
    await credentialCache.start();
    cleanups.push(() => credentialCache.stop());
    // Other nodes may hold these accounts with their former role.
    for (const id of promoted) await credentialCache.forgetAccount(id);

    let mailer: Mailer;
    if (config.MAIL_TRANSPORT === 'smtp') {
      const smtp = smtpMailer(config.SMTP_URL as string, config.MAIL_FROM);
      cleanups.push(() => smtp.close());
      mailer = smtp;
    } else {
      mailer = fileMailer(config.MAIL_DIR ?? join(config.DATA_DIR, 'mail'));
    }

    // The event log: Redis Streams when REDIS_URL is set, else in memory. Every append goes
    // through the one write path (redaction), and the worker copies the log into Postgres.
    // A producer mark the hot log lacks (new producer, or Redis lost it) comes from the copy.
    const loadMark = (tenant: string, producer: string) => logEvents.durableMark(db.sql, tenant, producer);
    let eventLog: EventLog;
    if (redis) {
      eventLog = redisEventLog(redis.redis, redis.subscriber, { prefix: config.REDIS_KEY_PREFIX, loadMark });
    } else {
      eventLog = memoryEventLog({ loadMark });
    }
    cleanups.push(() => eventLog.close());
    const redaction = new Redaction(conversationSecretStore({ sql: db.sql, keyring }));
    const metrics = new ServiceMetrics({ edgeProcess: overrides.edgeProcess ?? 0 });
    if (overrides.gatherMetrics) metrics.gatherWith(overrides.gatherMetrics);
    // Webhook consumers read each tenant's log through a consumer group; the copier's trim
    // keeps what a group has not acknowledged (up to LOG_HOLD_MAX_EVENTS a tenant).
    const groups = redis
      ? redisConsumerGroups(redis.redis, { prefix: config.REDIS_KEY_PREFIX })
      : memoryConsumerGroups(eventLog);
    const copier = new LogCopier(
      { sql: db.sql, log: eventLog, logger: log.child({ role: 'worker' }), holds: (t) => groups.holdFrom(t) },
      {
        intervalMs: config.LOG_COPY_INTERVAL_MS,
        batch: 1000,
        keepHot: config.LOG_HOT_EVENTS,
        maxHeld: config.LOG_HOLD_MAX_EVENTS,
      },
    );
    await copier.start();
    cleanups.push(() => copier.stop());
    // Runs before the copy's last pass and after everything that appends has stopped (the
    // edge, the fabric, the outbox relay): what the redactors still hold back is kept for the
    // process that takes the conversations over, instead of going with this one.
    cleanups.push(async () => {
      const n = await redaction.saveHeld().catch((err: Error) => {
        log.warn({ err: { message: err.message } }, 'held-back output not saved');
        return 0;
      });
      if (n > 0) log.info({ conversations: n }, 'held-back output saved for the next process');
    });
    const append = createAppender(eventLog, redaction);
    const appendEvents: AppendEvents = async (input) => {
      const result = await append(input);
      if (result.status === 'appended') {
        copier.track(input.tenant);
        metrics.appended(result.events.length);
      }
      return result;
    };
    // Events the service emits reach the log through the outbox, written with the state change.
    const relay = new OutboxRelay(
      { sql: db.sql, appendEvents, logger: log.child({ role: 'worker' }), listen: true },
      { intervalMs: config.LOG_COPY_INTERVAL_MS, batch: 500 },
    );
    copier.onDurable((tenant, marks) => {
      const seq = marks.get(outbox.OUTBOX_PRODUCER);
      if (seq !== undefined) {
        relay.durable(tenant, seq).catch((err: Error) => log.warn({ err: { message: err.message } }, 'outbox forget'));
      }
    });
    await relay.start();
    cleanups.push(() => relay.stop());
    // Turns that ended before replies were stored get theirs from the log, once, in the
    // background (search finds them by prompt only until then); stopped at shutdown.
    const backfill = new AbortController();
    const backfilled = backfillReplies({ sql: db.sql, log: eventLog }, { signal: backfill.signal }).then(
      (turns) => turns && log.info({ turns }, 'search: stored the replies of turns that ended before replies were'),
      (err: Error) => log.warn({ err: { message: err.message } }, 'search: reply backfill stopped'),
    );
    cleanups.push(() => {
      backfill.abort();
      return backfilled;
    });

    let boundPort = config.PORT;
    const base = () => publicUrl(config, boundPort);
    const billing = billingOf(config, base);

    // The runner fabric: sessions of connected runners, whichever transport carries them.
    const fabric = new RunnerFabric(
      {
        sql: db.sql,
        logger: log.child({ role: 'fabric' }),
        appendEvents,
        ...runnerEventHandlers({
          sql: db.sql,
          log: eventLog,
          logger: log.child({ role: 'fabric' }),
          redaction,
          billing,
        }),
      },
      {
        heartbeatMs: config.RUNNER_HEARTBEAT_MS,
        silenceMs: config.RUNNER_GRACE_MS,
        commandTimeoutMs: 10_000,
        maxQueuedBytes: config.RUNNER_MAX_QUEUED_BYTES,
      },
    );
    cleanups.push(() => fabric.shutdown());
    // Several nodes on one Redis: commands and durable marks reach the node holding the runner.
    const router = redis
      ? redisRunnerRouter({
          redis: redis.redis,
          subscriber: redis.subscriber,
          prefix: config.REDIS_KEY_PREFIX,
          holdMs: config.RUNNER_GRACE_MS + 2 * config.RUNNER_HEARTBEAT_MS,
          timeoutMs: 10_000,
          run: (runnerId, body) => fabric.commandHere(runnerId, body),
          onDurable: (marks) => fabric.durable(marks),
          onDisconnect: (who, code, reason) => fabric.disconnectHere(who, code, reason),
          logger: log.child({ role: 'fabric-router' }),
        })
      : undefined;
    if (router) {
      fabric.setRouter(router);
      cleanups.push(() => router.close());
    }
    copier.onDurable((_tenant, marks) => {
      fabric.durable(marks);
      router?.durable(marks);
    });
    const local = new LocalSandboxes({
      sql: db.sql,
      fabric,
      logger: log.child({ role: 'local-sandboxes' }),
      // Local runner-agents connect to this process directly, whatever PUBLIC_URL says.
      baseUrl: () => publicUrl({ ...config, PUBLIC_URL: undefined }, boundPort),
      root: join(config.DATA_DIR, 'local-sandboxes'),
      isolation: config.SANDBOX_ISOLATION,
      // What its sandboxes must not see: the instance's data (master key, database, mail).
      hidden: [resolve(config.DATA_DIR)],
    });
    cleanups.push(() => local.stopAll());
    const providers = new SandboxProviders(
      [local, runnerProvider({ sql: db.sql, fabric, offlineAfterMs: config.RUNNER_GRACE_MS })],
      config.SANDBOX_PROVIDER_DEFAULT,
    );
    const adrift = new TurnsAdriftWorker(
      { sql: db.sql, providers, logger: log.child({ role: 'worker' }) },
      { graceMs: config.RUNNER_GRACE_MS },
    );
    adrift.start();
    cleanups.push(() => adrift.stop());
    const idle = new IdleSuspendWorker(
      { sql: db.sql, providers, relay, logger: log.child({ role: 'suspend' }) },
      { idleMs: config.SANDBOX_IDLE_SUSPEND_MS },
    );
    idle.start();
    cleanups.push(() => idle.stop());
    // The same timeout the fabric closes a silent connection after, for drops no node closed.
    const presence = new RunnerPresenceWorker(
      { sql: db.sql, logger: log.child({ role: 'worker' }) },
      { timeoutMs: config.RUNNER_GRACE_MS },
    );
    presence.start();
    cleanups.push(() => presence.stop());
    const lost = new LostMachinesWorker({ sql: db.sql, providers, logger: log.child({ role: 'worker' }) });
    lost.start();
    cleanups.push(() => lost.stop());
    // Whether the broker is on or not: rows written while it was on still expire.
    const egressSweep = new EgressLogSweeper(
      { sql: db.sql, logger: log.child({ role: 'worker' }) },
      { retentionHours: config.BROKER_LOG_RETENTION_HOURS },
    );
    egressSweep.start();
    cleanups.push(() => egressSweep.stop());

    let limiter: RateLimiter | undefined;
    if (config.RATE_LIMIT_PER_MINUTE > 0) {
      const opts = { perMinute: config.RATE_LIMIT_PER_MINUTE, burst: config.RATE_LIMIT_PER_MINUTE };
      limiter = redis ? redisRateLimiter(redis.redis, opts, config.REDIS_KEY_PREFIX) : memoryRateLimiter(opts);
    }

    // One registry per process: per tenant one feed of the log, one timer for all deadlines.
    const turnWaiters = new TurnWaiters({
      log: eventLog,
      readTurn: (accountId, turnId) => conversations.getTurn(db.sql, accountId, turnId),
    });

    const redisClient = redis?.redis;
    const launch: LaunchDeps = {
      sql: db.sql,
      keyring,
      fabric,
      redaction,
      logger: log.child({ role: 'launch' }),
      runtimeCommands: {
        claude: config.RUNTIME_CLAUDE_COMMAND,
        codex: config.RUNTIME_CODEX_COMMAND,
        gemini: config.RUNTIME_GEMINI_COMMAND,
        opencode: config.RUNTIME_OPENCODE_COMMAND,
      },
      turnTimeLimitMs: config.TURN_TIME_LIMIT_MS,
      autonomousIdleMs: config.AUTONOMOUS_IDLE_MS,
      log: eventLog,
      permissionTimeoutMs: config.PERMISSION_TIMEOUT_S * 1000,
      providers,
      relay,
      apiUrl: base,
      limits: { quota: config.SANDBOX_QUOTA_DEFAULT, fleetMax: config.FLEET_MAX_SANDBOXES },
      billing,
      broker: config.EGRESS_BROKER === 'on',
      providerUrls: {
        anthropic: config.ANTHROPIC_BASE_URL,
        openai: config.OPENAI_BASE_URL,
        google: config.GEMINI_BASE_URL,
      },
    };
    // Webhook delivery jobs are sent by this worker (and those of other nodes); what writes
    // jobs in this process (the consumer, the test and redeliver routes) wakes it at once.
    const webhookDelivery = new WebhookDeliveryWorker(
      {
        sql: db.sql,
        keyring,
        mailer,
        logger: log.child({ role: 'webhooks' }),
        now: () => new Date(),
        publicUrl: base,
        transport: { resolve: systemResolver, allowed: exemptList(config.WEBHOOK_ALLOW_CIDRS) },
      },
      {
        periodMs: config.WEBHOOK_INTERVAL_MS,
        concurrency: config.WEBHOOK_CONCURRENCY,
        perEndpoint: config.WEBHOOK_ENDPOINT_CONCURRENCY,
        timeoutMs: config.WEBHOOK_TIMEOUT_MS,
      },
    );
    webhookDelivery.start();
    // Requests under way get the shutdown grace to finish and be recorded (before the database
    // closes); one cut short is sent again once its lease expires.
    cleanups.push(async () => {
      webhookDelivery.stop();
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, config.SHUTDOWN_GRACE_MS);
      });
      await Promise.race([webhookDelivery.settled(), grace]);
      clearTimeout(timer);
    });

    // Export files live under DATA_DIR: built by the export worker, served by the download
    // route, removed with their account.
    const exportFiles = new ExportFiles(config.DATA_DIR);
    const deps: ApiDeps = {
      config,
      sql: db.sql,
      log,
      mailer,
      keyring,
      credentialCache,
      publicUrl: base,
      accounts: {
        sql: db.sql,
        mailer,
        keyring,
        log,
        publicUrl: base,
        adminEmails: config.ADMIN_EMAILS.map((e) => e.toLowerCase()),
        exportFiles,
        credentialCache,
      },
      inference: {
        baseUrls: {
          anthropic: config.ANTHROPIC_BASE_URL,
          openai: config.OPENAI_BASE_URL,
          gemini: config.GEMINI_BASE_URL,
        },
        timeoutMs: config.PROVIDER_CHECK_TIMEOUT_MS,
      },
      paymentEnabled: billing !== null,
      billing,
      eventLog,
      retireSandboxes:
        overrides.retireSandboxes ??
        retireSandboxesBuiltOn({ sql: db.sql, fabric, providers, logger: log.child({ role: 'sandboxes' }) }),
      fabric,
      readiness: {
        sql: db.sql,
        pingRedis: redisClient ? () => redisClient.ping() : undefined,
        timeoutMs: 2000,
      },
      metrics,
      launch,
      exportFiles,
      teamMcp: {
        sql: db.sql,
        team: teamOps({ launch, runnerOfflineAfterMs: config.RUNNER_GRACE_MS }),
        waiters: turnWaiters,
        waitMs: config.TEAM_WAIT_MS,
      },
      webhookJobsQueued: () => webhookDelivery.workArrived(),
    };

    // A claim outlives any launch by far; only a worker that died lets one expire.
    const scheduler = new SchedulerWorker(
      { sql: db.sql, launch: deps.launch, now: () => new Date(), logger: log.child({ role: 'scheduler' }), metrics },
      { periodMs: config.SCHEDULER_INTERVAL_MS, leaseMs: 5 * 60_000 },
    );
    scheduler.start();
    cleanups.push(() => scheduler.stop());

    // Support reports go to an issue and/or a mailbox, whichever is configured; a lease outlives
    // a batch's requests (10 s timeout each) by far, so only a worker that died lets one expire.
    const supportForwarder = new SupportForwarder(
      {
        sql: db.sql,
        issues:
          config.SUPPORT_GITHUB_REPOSITORY && config.SUPPORT_GITHUB_TOKEN
            ? githubIssues({
                apiUrl: config.SUPPORT_GITHUB_API_URL,
                repository: config.SUPPORT_GITHUB_REPOSITORY,
                token: config.SUPPORT_GITHUB_TOKEN,
                timeoutMs: 10_000,
              })
            : undefined,
        mail: config.SUPPORT_EMAIL ? { mailer, to: config.SUPPORT_EMAIL } : undefined,
        now: () => new Date(),
        logger: log.child({ role: 'support' }),
      },
      {
        periodMs: config.SUPPORT_FORWARD_INTERVAL_MS,
        leaseMs: 10 * 60_000,
        maxAttempts: config.SUPPORT_FORWARD_ATTEMPTS,
        retryBaseMs: 60_000,
      },
    );
    supportForwarder.start();
    cleanups.push(() => supportForwarder.stop());

    // Exports: a lease outlives the time between two pages of events by far (it is extended at
    // each), so only a worker that died lets one expire; the next pass builds it again.
    const exportBuilder = new ExportBuilder(
      {
        sql: db.sql,
        log: eventLog,
        files: deps.exportFiles,
        logger: log.child({ role: 'exports' }),
        now: () => new Date(),
      },
      { periodMs: config.EXPORT_WORKER_INTERVAL_MS, leaseMs: 2 * 60_000 },
    );
    exportBuilder.start();
    cleanups.push(() => exportBuilder.stop());
    // Stage events become delivery jobs (one per matching endpoint) from the log itself.
    if (config.WEBHOOK_CONSUMER_SWEEP_MS > 0) {
      const consumer = new WebhookConsumer(
        {
          sql: db.sql,
          log: eventLog,
          groups,
          sink: async (accountId, events) => {
            if ((await enqueueWebhookJobs(db.sql, accountId, events)) > 0) webhookDelivery.workArrived();
          },
          tenants: () => tenantsWithEndpoints(db.sql),
          since: (accountId) => consumerMarks.endpointsActiveSince(db.sql, accountId),
          logger: log.child({ role: 'webhook-consumer' }),
        },
        {
          name: defaultConsumerName(),
          batch: 500,
          minIdleMs: config.WEBHOOK_CONSUMER_IDLE_MS,
          sweepMs: config.WEBHOOK_CONSUMER_SWEEP_MS,
        },
      );
      await consumer.start();
      cleanups.push(() => consumer.stop());
    }

    // One stream implementation, served by whichever server listens: the edge, or Fastify alone.
    const streams = new StreamServer({
      sql: db.sql,
      credentialCache,
      log: eventLog,
      logger: log.child({ role: config.EDGE ? 'edge' : 'api' }),
      corsOrigins: config.API_CORS_ORIGINS,
      options: {
        heartbeatMs: config.SSE_HEARTBEAT_MS,
        idleCloseMs: config.SSE_IDLE_CLOSE_MS,
        maxBufferedBytes: config.SSE_MAX_BUFFER_BYTES,
        maxPerAccount: config.SSE_MAX_STREAMS_PER_ACCOUNT,
      },
    });
    // An account suspended or deleted on any node: its streams here end with its runners.
    fabric.onAccountClosed((accountId) => streams.endAccount(accountId));
    metrics.observe({
      watchers: () => streams.watchers,
      runners: () => fabric.connectedRunners,
      copied: () => copier.copied,
      copyLagSeconds: () => copier.pending().oldestMs / 1000,
      copyPendingTenants: () => copier.pending().tenants,
    });
    const { app: api, routeTable } = await buildApi(deps, {
      behindEdge: config.EDGE,
      alone: config.EDGE
        ? undefined
        : { admitFor: admission(limiter, config.RATE_LIMIT_EXEMPT, log.child({ role: 'api' }), metrics), streams },
    });
    cleanups.push(async () => {
      // A close waits for the responses under way; one to a client that stopped reading never
      // finishes, so what is left after the grace is cut, as the edge cuts its sockets.
      const cut = setTimeout(() => api.server.closeAllConnections(), config.SHUTDOWN_GRACE_MS);
      try {
        await api.close();
      } finally {
        clearTimeout(cut);
      }
    });
    // Open streams end before the listener closes.
    cleanups.push(async () => streams.close());
    // Held waits answer (timed out) before the api waits for its responses to finish.
    cleanups.push(() => turnWaiters.close());
    if (!config.EDGE) {
      // Node's listener binds without SO_REUSEPORT: a port anyone holds fails EADDRINUSE.
      await api.listen({ host: config.HOST, port: config.PORT }).catch(async (err: NodeJS.ErrnoException) => {
        throw err.code === 'EADDRINUSE' ? await portInUse(config.HOST, config.PORT) : err;
      });
      const addr = api.server.address();
      boundPort = typeof addr === 'object' && addr ? addr.port : config.PORT;
    } else {
      // The api role does not listen: the edge hands it each request in this process (no
      // socket between them), with the client address header it set itself.
      const forwarder = createForwarder(api.routing, log.child({ role: 'edge' }), config.BODY_LIMIT_BYTES);
      const edge = await startEdge({
        host: config.HOST,
        port: config.PORT === 0 && config.EDGE_PROCESSES > 1 ? await freePort(config.HOST) : config.PORT,
        sharing: overrides.joinsGroupPort ? 'group-member' : config.EDGE_PROCESSES > 1 ? 'group-first' : 'alone',
        limiter,
        rateLimitExempt: config.RATE_LIMIT_EXEMPT,
        metrics,
        trustProxy: config.TRUST_PROXY,
        forwarder,
        log: log.child({ role: 'edge' }),
        fabric,
        streams,
      });
      cleanups.push(() => edge.close(config.SHUTDOWN_GRACE_MS));
      boundPort = edge.port;
    }

    // More processes on this port, started once this one is listening (and has migrated).
    // Pushed last, so close() tells them to stop first, then drains this one meanwhile.
    let edgeProcesses: EdgeProcesses | undefined;
    if (config.EDGE_PROCESSES > 1) {
      const processes = await startEdgeProcesses({
        config: { ...config, PORT: boundPort, EDGE_PROCESSES: 1, MASTER_KEY: key.toString('hex') },
        count: config.EDGE_PROCESSES - 1,
        log: log.child({ role: 'edge-processes' }),
        ownMetrics: () => metrics.snapshot(),
      });
      metrics.gatherWith(() => processes.gatherMetrics());
      cleanups.push(() => {
        childrenStopped = processes.stop(config.SHUTDOWN_GRACE_MS + 5000);
      });
      edgeProcesses = processes;
    }

    return {
      url: base(),
      port: boundPort,
      config,
      db,
      mailer,
      keyring,
      log,
      credentialCache,
      eventLog,
      appendEvents,
      redaction,
      copier,
      relay,
      fabric,
      local,
      providers,
      launch: deps.launch,
      metrics,
      turnWaiters,
      edgeProcesses,
      routes: routeTable.entries,
      close: closeAll,
    };
  } catch (err) {
    await closeAll().catch(() => {});
    throw err;
  }
}

/**
 * Billing from configuration: on when PAYMENT_PROVIDER_KEY is set (the provider is Stripe's
 * REST API at PAYMENT_API_URL), null (payment off) otherwise.
 */
function billingOf(config: Config, base: () => string): Billing | null {
  const key = config.PAYMENT_PROVIDER_KEY;
  if (!key) return null;
  return {
    payments: stripePayments({
      apiUrl: config.PAYMENT_API_URL,
      secretKey: key,
      webhookSecret: config.PAYMENT_WEBHOOK_SECRET ?? '',
      timeoutMs: config.PROVIDER_CHECK_TIMEOUT_MS,
    }),
    pack: {
      creditCents: config.PAYMENT_CREDIT_PACK_CENTS,
      priceCents: config.PAYMENT_CREDIT_PACK_PRICE_CENTS,
      currency: config.PAYMENT_CURRENCY,
    },
    centsPerTurnHour: config.PAYMENT_CENTS_PER_TURN_HOUR,
    monthlyCapCents: config.PAYMENT_MONTHLY_CAP_CENTS ?? null,
    upgradeUrl: () => config.PAYMENT_UPGRADE_URL ?? base(),
    publicUrl: base,
  };
}
