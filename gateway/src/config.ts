import { z } from 'zod';
import { cidrProblem } from './addresses.ts';

const bool = z
  .enum(['true', 'false', '1', '0', 'on', 'off', 'yes', 'no'])
  .transform((v) => v === 'true' || v === '1' || v === 'on' || v === 'yes');

const url = z.url({ message: 'must be a URL' });

const csv = z.string().transform((s) =>
  s
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean),
);

/**
 * Every environment variable the service reads, validated at start. README's configuration
 * table mirrors this list. A bad value stops the process with a message naming the variable.
 */
export const ConfigSchema = z.object({
  PORT: z.coerce.number().int().min(0).max(65535).default(8080),
  HOST: z.string().default('127.0.0.1'),
  PUBLIC_URL: url.optional(),
  DATABASE_URL: z.string().optional(),
  DATABASE_POOL_MAX: z.coerce.number().int().min(1).max(200).default(10),
  REDIS_URL: z.string().optional(),
  REDIS_CLUSTER: bool.default(false),
  REDIS_KEY_PREFIX: z.string().default(''),
  DATA_DIR: z.string().default('.data'),
  MASTER_KEY: z
    .string()
    .regex(/^([0-9a-fA-F]{64}|[A-Za-z0-9+/]{43}=)$/, 'must be 32 bytes as 64 hex digits or base64')
    .optional(),
  MAIL_TRANSPORT: z.enum(['file', 'smtp']).default('file'),
  MAIL_DIR: z.string().optional(),
  MAIL_FROM: z.string().default('svc <no-reply@localhost>'),
  SMTP_URL: z.string().optional(),
  ADMIN_EMAILS: csv.default([]),
  OAUTH_CLIENTS: z
    .string()
    .default('{}')
    .transform((s, ctx) => {
      try {
        return JSON.parse(s) as unknown;
      } catch {
        ctx.addIssue({ code: 'custom', message: 'must be JSON: {"client_id": ["https://app/callback"]}' });
        return z.NEVER;
      }
    })
    .pipe(z.record(z.string().min(1), z.array(url).min(1))),
  API_CORS_ORIGINS: csv.default([]),
  RATE_LIMIT_PER_MINUTE: z.coerce.number().int().min(0).default(600),
  RATE_LIMIT_EXEMPT: csv.default([]),
  /** How long a node may use a key or session it resolved without asking Postgres again; 0 never. */
  AUTH_CACHE_TTL_MS: z.coerce.number().int().min(0).max(300_000).default(10_000),
  /** Proxies (CIDRs) whose X-Forwarded-For is believed; unset, the socket's peer is the client. */
  TRUST_PROXY: csv.default([]).superRefine((entries, ctx) => {
    for (const entry of entries) {
      const problem = cidrProblem(entry);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }
  }),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  EDGE: bool.default(true),
  EDGE_PROCESSES: z.coerce.number().int().min(1).max(256).default(1),
  METRICS_TOKEN: z.string().min(16, 'must be at least 16 characters').optional(),
  BODY_LIMIT_BYTES: z.coerce
    .number()
    .int()
    .min(1024)
    .default(8 * 1024 * 1024),
  ANTHROPIC_BASE_URL: url.default('https://api.anthropic.com'),
  OPENAI_BASE_URL: url.default('https://api.openai.com'),
  GEMINI_BASE_URL: url.default('https://generativelanguage.googleapis.com'),
  PROVIDER_CHECK_TIMEOUT_MS: z.coerce.number().int().min(100).default(10_000),
  AVATAR_IMAGE_MODEL: z.string().default('gpt-image-1'),
  AVATAR_TIMEOUT_MS: z.coerce.number().int().min(100).default(120_000),
  APP_CONVERSATIONS_URL: url.optional(),
  APP_TEAM_URL: url.optional(),
  SHUTDOWN_GRACE_MS: z.coerce.number().int().min(0).default(10_000),
  SSE_HEARTBEAT_MS: z.coerce.number().int().min(10).default(15_000),
  SSE_IDLE_CLOSE_MS: z.coerce.number().int().min(0).default(60_000),
  SSE_MAX_BUFFER_BYTES: z.coerce
    .number()
    .int()
    .min(1024)
    .default(1024 * 1024),
  /** Event streams one account may hold open on one node; 0 sets no ceiling. */
  SSE_MAX_STREAMS_PER_ACCOUNT: z.coerce.number().int().min(0).default(1000),
  LOG_HOT_EVENTS: z.coerce.number().int().min(1).default(10_000),
  LOG_COPY_INTERVAL_MS: z.coerce.number().int().min(10).default(250),
  /** Webhook URLs may be plain `http://` (the scheme rule only; addresses are still checked). */
  WEBHOOK_ALLOW_HTTP: bool.default(false),
  /**
   * Ranges (CIDRs or addresses) webhooks may reach although they are not public: this weakens
   * the protection against reaching internal services, for these ranges only.
   */
  WEBHOOK_ALLOW_CIDRS: csv.default([]).superRefine((entries, ctx) => {
    for (const entry of entries) {
      const problem = cidrProblem(entry);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }
  }),
  /** How often a webhook delivery worker looks for due jobs; 0 turns it off. */
  WEBHOOK_INTERVAL_MS: z.coerce.number().int().min(0).default(1000),
  /** Webhook requests in flight per process, and per endpoint across all processes. */
  WEBHOOK_CONCURRENCY: z.coerce.number().int().min(1).max(1000).default(32),
  WEBHOOK_ENDPOINT_CONCURRENCY: z.coerce.number().int().min(1).max(100).default(4),
  /** How long one webhook request may take, connect to last byte kept (SPEC Limits: 10 s). */
  WEBHOOK_TIMEOUT_MS: z.coerce.number().int().min(100).max(60_000).default(10_000),
  /**
   * How often each node's webhook consumer refreshes the accounts it reads, takes over what
   * dead consumers held and records how far it got; 0 turns the consumer off on this node.
   */
  WEBHOOK_CONSUMER_SWEEP_MS: z.coerce.number().int().min(0).default(5000),
  /** How long a batch stays with a consumer that has not acknowledged it before another takes it. */
  WEBHOOK_CONSUMER_IDLE_MS: z.coerce.number().int().min(100).default(30_000),
  /** Events per tenant the hot log keeps for a webhook consumer behind it; further behind, it reads Postgres. */
  LOG_HOLD_MAX_EVENTS: z.coerce.number().int().min(1).default(100_000),
  /** How often the scheduler looks for due schedules; 0 turns it off. */
  SCHEDULER_INTERVAL_MS: z.coerce.number().int().min(0).default(10_000),
  /** Where support reports are mailed (screenshot attached); unset, none are mailed. */
  SUPPORT_EMAIL: z.email({ message: 'must be an email address' }).optional(),
  /** `owner/name` of the repository support reports open issues in, with SUPPORT_GITHUB_TOKEN. */
  SUPPORT_GITHUB_REPOSITORY: z
    .string()
    .regex(/^[A-Za-z0-9_.-]+\/[A-Za-z0-9_.-]+$/, 'must be owner/name')
    .optional(),
  SUPPORT_GITHUB_TOKEN: z.string().optional(),
  /** GitHub's REST API root; GitHub Enterprise Server's is `https://<host>/api/v3`. */
  SUPPORT_GITHUB_API_URL: url.default('https://api.github.com'),
  /** How often the forwarder looks for new support reports; 0 turns it off. */
  SUPPORT_FORWARD_INTERVAL_MS: z.coerce.number().int().min(0).default(10_000),
  /** Forwarding attempts per report before it ends `failed`. */
  SUPPORT_FORWARD_ATTEMPTS: z.coerce.number().int().min(1).max(50).default(6),
  /**
   * The payment provider's secret key (Stripe's `sk_...`). Set, payment is on: turns are
   * charged, launches and prompts need credit, and the billing routes answer.
   */
  PAYMENT_PROVIDER_KEY: z.string().min(1).optional(),
  /** The payment provider's API root (Stripe's REST shape). */
  PAYMENT_API_URL: url.default('https://api.stripe.com'),
  /** The signing secret (`whsec_...`) of the provider's webhook endpoint `/api/webhooks/stripe`. */
  PAYMENT_WEBHOOK_SECRET: z.string().min(1).optional(),
  /** Credit one pack adds, and what it costs, in cents of PAYMENT_CURRENCY. */
  PAYMENT_CREDIT_PACK_CENTS: z.coerce.number().int().min(1).default(1000),
  PAYMENT_CREDIT_PACK_PRICE_CENTS: z.coerce.number().int().min(1).default(1000),
  PAYMENT_CURRENCY: z
    .string()
    .regex(/^[a-z]{3}$/, 'must be a lower-case ISO currency code')
    .default('usd'),
  /** What an hour of turn time costs, in cents (a turn is metered from its start to its end). */
  PAYMENT_CENTS_PER_TURN_HOUR: z.coerce.number().int().min(0).default(100),
  /** Credit a month may burn, in cents; unset, no cap. */
  PAYMENT_MONTHLY_CAP_CENTS: z.coerce.number().int().min(1).optional(),
  /** Where a 402 `insufficient_credits` sends people to buy credit; default PUBLIC_URL. */
  PAYMENT_UPGRADE_URL: url.optional(),
  /** How often the export worker looks for pending exports; 0 turns it off. */
  EXPORT_WORKER_INTERVAL_MS: z.coerce.number().int().min(0).default(2000),
  RUNNER_HEARTBEAT_MS: z.coerce.number().int().min(100).default(10_000),
  RUNTIME_CLAUDE_COMMAND: z.string().min(1).default('claude-agent-acp'),
  RUNTIME_CODEX_COMMAND: z.string().min(1).default('codex-acp'),
  RUNTIME_GEMINI_COMMAND: z.string().min(1).default('gemini --experimental-acp'),
  RUNTIME_OPENCODE_COMMAND: z.string().min(1).default('opencode acp'),
  SANDBOX_PROVIDER_DEFAULT: z.enum(['local', 'runner']).default('local'),
  /**
   * How `local` sandboxes are isolated: `namespaces` (each in namespaces of its own, through
   * bubblewrap; a machine that cannot refuses to build them, saying why) or `none`.
   */
  SANDBOX_ISOLATION: z.enum(['namespaces', 'none']).default('namespaces'),
  /**
   * The egress credential broker: `on`, every account is brokered (bound secrets never enter
   * a sandbox; the proxy writes them for their host) and the secret-binding and egress-log
   * routes answer; `off`, they answer 404 `broker: "disabled"`. Unset: `on` where
   * SANDBOX_ISOLATION is `namespaces`, else `off` (see loadConfig).
   */
  EGRESS_BROKER: z.enum(['on', 'off']).optional(),
  /** Hours the broker's egress log of a conversation is kept after the conversation ends. */
  BROKER_LOG_RETENTION_HOURS: z.coerce.number().int().min(1).default(72),
  SANDBOX_QUOTA_DEFAULT: z.coerce.number().int().min(0).default(10),
  FLEET_MAX_SANDBOXES: z.coerce.number().int().min(0).default(100),
  TURN_TIME_LIMIT_MS: z.coerce
    .number()
    .int()
    .min(1000)
    .default(30 * 60_000),
  /** A runtime that keeps working after its answer: its autonomous turn ends after this long quiet. */
  AUTONOMOUS_IDLE_MS: z.coerce.number().int().min(100).default(5000),
  /** How long `wait_for_teammate` holds a call before it answers timed_out (SPEC Limits: up to 90 s). */
  TEAM_WAIT_MS: z.coerce.number().int().min(100).max(90_000).default(90_000),
  RUNNER_GRACE_MS: z.coerce.number().int().min(200).default(30_000),
  /** Output one runner connection may have waiting to be appended before it is closed (it resends). */
  RUNNER_MAX_QUEUED_BYTES: z.coerce
    .number()
    .int()
    .min(16 * 1024)
    .default(64 * 1024 * 1024),
  /**
   * A `local` sandbox that is ready and saw no turn for this long is suspended: its
   * runner-agent (and runtimes) stop, its directory is kept, and the next prompt wakes it.
   * 0 never suspends.
   */
  SANDBOX_IDLE_SUSPEND_MS: z.coerce
    .number()
    .int()
    .min(0)
    .default(15 * 60_000),
  PERMISSION_TIMEOUT_S: z.coerce.number().int().min(1).default(300),
});

/** The parsed configuration, with the defaults that derive from other settings filled in. */
export type Config = Omit<z.infer<typeof ConfigSchema>, 'EGRESS_BROKER'> & { EGRESS_BROKER: 'on' | 'off' };

export class ConfigError extends Error {}

/** Parses configuration from an environment; throws ConfigError naming each bad variable. */
export function loadConfig(env: Record<string, string | undefined>): Config {
  const input: Record<string, string> = {};
  for (const key of Object.keys(ConfigSchema.shape)) {
    const v = env[key];
    if (v !== undefined && v !== '') input[key] = v;
  }
  const parsed = ConfigSchema.safeParse(input);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => `  ${String(i.path[0] ?? '?')}: ${i.message}`);
    throw new ConfigError(`invalid configuration:\n${lines.join('\n')}`);
  }
  const config: Config = {
    ...parsed.data,
    // The broker needs the sandbox's network namespace (its proxy is the one way out): on by
    // default only where sandboxes are isolated.
    EGRESS_BROKER: parsed.data.EGRESS_BROKER ?? (parsed.data.SANDBOX_ISOLATION === 'namespaces' ? 'on' : 'off'),
  };
  if (config.MAIL_TRANSPORT === 'smtp' && !config.SMTP_URL) {
    throw new ConfigError('invalid configuration:\n  SMTP_URL: required when MAIL_TRANSPORT=smtp');
  }
  // A repository without a token (or the reverse) would leave support issues silently unopened.
  if (Boolean(config.SUPPORT_GITHUB_REPOSITORY) !== Boolean(config.SUPPORT_GITHUB_TOKEN)) {
    const [set, missing] = config.SUPPORT_GITHUB_REPOSITORY
      ? ['SUPPORT_GITHUB_REPOSITORY', 'SUPPORT_GITHUB_TOKEN']
      : ['SUPPORT_GITHUB_TOKEN', 'SUPPORT_GITHUB_REPOSITORY'];
    throw new ConfigError(`invalid configuration:\n  ${missing}: required when ${set} is set`);
  }
  // Without the signing secret no purchase would ever be credited.
  if (config.PAYMENT_PROVIDER_KEY && !config.PAYMENT_WEBHOOK_SECRET) {
    throw new ConfigError(
      'invalid configuration:\n  PAYMENT_WEBHOOK_SECRET: required when PAYMENT_PROVIDER_KEY is set',
    );
  }
  if (config.REDIS_CLUSTER && !config.REDIS_URL) {
    throw new ConfigError('invalid configuration:\n  REDIS_URL: required when REDIS_CLUSTER=true');
  }
  // On a cluster the hash tag is the first {...} of a key: a brace in the prefix would move
  // every key of a tenant off its `{t:<tenant>}` tag and split them across shards.
  if (config.REDIS_CLUSTER && /[{}]/.test(config.REDIS_KEY_PREFIX)) {
    throw new ConfigError(
      'invalid configuration:\n  REDIS_KEY_PREFIX: must not contain { or } when REDIS_CLUSTER=true',
    );
  }
  // Several processes on one port are several nodes: they can share only what lives in servers.
  if (config.EDGE_PROCESSES > 1) {
    const why = (variable: string, reason: string) =>
      new ConfigError(`invalid configuration:\n  ${variable}: ${reason} when EDGE_PROCESSES > 1`);
    if (!config.REDIS_URL) {
      throw why('REDIS_URL', 'required (the in-memory log, bus and rate limits cannot be shared between processes)');
    }
    if (!config.DATABASE_URL || config.DATABASE_URL === 'memory') {
      throw why(
        'DATABASE_URL',
        'must name a Postgres server (the embedded database serves the one process that holds DATA_DIR)',
      );
    }
    // uWebSockets.js listens with SO_REUSEPORT; Node's own listener gains `reusePort` only in
    // Node 22.12, and this service runs on Node 20.
    if (!config.EDGE) {
      throw why('EDGE', 'must be true (only the uWebSockets.js edge can share its port between processes on Node 20)');
    }
  }
  return config;
}

/** The base URL links and redirects are built on. */
export function publicUrl(config: Config, boundPort: number): string {
  if (config.PUBLIC_URL) return config.PUBLIC_URL.replace(/\/$/, '');
  const host = config.HOST === '0.0.0.0' || config.HOST === '::' ? '127.0.0.1' : config.HOST;
  return `http://${host.includes(':') ? `[${host}]` : host}:${boundPort}`;
}
