import { Packr } from 'msgpackr';
import { z } from 'zod';

/**
 * The runner fabric's wire protocol (DESIGN.md "The runner fabric"): binary WebSocket frames,
 * each one msgpack-encoded message whose shape is a schema below, validated on both sides.
 * The runner says which protocol version it speaks in its hello; the service refuses one it
 * does not speak with the close code `unsupported_protocol`.
 */
export const RUNNER_PROTOCOL_VERSION = 1;

/** The path runners connect to (wss://<base>/api/runners/connect). */
export const RUNNER_CONNECT_PATH = '/api/runners/connect';

/**
 * Close codes the service ends a runner connection with (4000-4999 are the application's).
 * The runner-agent prints what each means and whether it will try again.
 */
export const RUNNER_CLOSE = {
  /**
   * Another connection with the same token took over (this one had gone silent, or it is the
   * same process's older one): the runner waits and tries again, as for `taken`.
   */
  replaced: 4001,
  /** The owner deleted the runner: its token no longer works. */
  revoked: 4002,
  /** A frame that is not a message of this protocol. */
  protocol_error: 4003,
  /** The hello's protocol version is not one the service speaks. */
  unsupported_protocol: 4004,
  /** No hello within the time allowed after connecting. */
  hello_timeout: 4005,
  /**
   * Another process holds a live connection with this runner token (heard from within the
   * grace): this one is refused, and waits and tries again until that one has gone.
   */
  taken: 4006,
  /** The service is shutting down; reconnect (to another node). */
  going_away: 1001,
} as const;

const SandboxHeld = z.object({ id: z.string().min(1).max(64), incarnation: z.number().int().min(0) });

/** The first message of a connection: who the runner is and what it still holds. */
export const RunnerHello = z.object({
  t: z.literal('hello'),
  protocol: z.number().int().min(1),
  /** The runner-agent's package version. */
  version: z.string().min(1).max(64),
  /** Random per process start: two processes sharing one token are told apart by it. */
  instance: z.string().min(8).max(64),
  hostname: z.string().min(1).max(255),
  /** The directory sandboxes live under (`--root`). */
  root: z.string().min(1).max(4096),
  /** What this runner takes beyond protocol 1's first commands (RUNNER_CAN_SUSPEND). */
  capabilities: z.array(z.string().max(64)).max(64),
  /** The sandboxes this process holds (built, and their runtimes its own). */
  sandboxes: z.array(SandboxHeld).max(10_000),
  /**
   * The sandboxes whose directories are under its root but that it does not hold (an earlier
   * process of the runner built them): each can be woken on its kept disk.
   */
  kept: z.array(z.string().min(1).max(64)).max(10_000).optional(),
});

export const RunnerHeartbeat = z.object({ t: z.literal('heartbeat') });

/** One log event as a runner emits it; the service appends it and the log gives it its id. */
export const RunnerEvent = z.object({
  conversation_id: z.string().min(1).max(64),
  turn_id: z.string().max(64).nullable().optional(),
  kind: z.enum(['output', 'stage']),
  stream: z.enum(['stdout', 'stderr', 'stage', 'acp']),
  data: z
    .string()
    .max(1024 * 1024)
    .nullable()
    .optional(),
  stage: z.string().max(32).nullable().optional(),
  state: z.string().max(32).nullable().optional(),
  duration_ms: z.number().int().min(0).nullable().optional(),
  /**
   * When it happened on the runner (ms since the epoch): an event held while the runner was
   * disconnected, or kept over its restart, carries its own time, not its arrival's.
   */
  at: z.number().int().positive().optional(),
});
export type RunnerEvent = z.infer<typeof RunnerEvent>;

/**
 * Output of one sandbox incarnation, numbered from 1 without holes: `seq` is the number of
 * the first event, the rest follow. The service answers `appended` with how far it holds
 * the incarnation's output; the runner keeps (and after a reconnect resends) what is beyond.
 */
export const RunnerOutput = z.object({
  t: z.literal('output'),
  sandbox: z.string().min(1).max(64),
  incarnation: z.number().int().min(0),
  seq: z.number().int().min(1),
  events: z.array(RunnerEvent).min(1).max(1000),
});
export type RunnerOutput = z.infer<typeof RunnerOutput>;

/** The runner took command `n` (it acts on it; results arrive as output). */
export const RunnerAck = z.object({ t: z.literal('ack'), n: z.number().int().min(1) });

/**
 * Requests that left a brokered sandbox through the runner's proxy, and its refusals (the
 * egress log; DECISIONS: no path, query or body). Sent as they happen, not kept: a row made
 * while the runner is away is lost.
 */
export const RunnerEgressRow = z.object({
  conversation_id: z.string().min(1).max(64),
  at: z.string().max(40),
  host: z.string().min(1).max(260),
  port: z.number().int().min(0).max(65_535),
  method: z.string().min(1).max(32),
  binding_id: z.string().max(64).nullable(),
  status: z.number().int().min(0).max(999).nullable(),
  latency_ms: z.number().int().min(0).nullable(),
  refused: z.boolean(),
  reason: z.string().max(500).nullable(),
});
export type RunnerEgressRow = z.infer<typeof RunnerEgressRow>;

export const RunnerEgressReport = z.object({ t: z.literal('egress'), rows: z.array(RunnerEgressRow).min(1).max(1000) });

export const RunnerMessage = z.discriminatedUnion('t', [
  RunnerHello,
  RunnerHeartbeat,
  RunnerOutput,
  RunnerAck,
  RunnerEgressReport,
]);
export type RunnerMessage = z.infer<typeof RunnerMessage>;
export type RunnerHello = z.infer<typeof RunnerHello>;

/** The service's answer to a hello: the connection's identity and the heartbeat it expects. */
export const ServiceWelcome = z.object({
  t: z.literal('welcome'),
  runner_id: z.string(),
  /** Increases with every accepted connection of this runner; commands carry it. */
  epoch: z.number().int().min(1),
  heartbeat_ms: z.number().int().min(100),
});

/**
 * A secret the runner's egress broker writes into requests (DECISIONS "Sandboxes that hold"):
 * the sandbox's variable holds `placeholder`; on a request to `host` (as in allowed_hosts) the
 * proxy sets `header` to `value` (the binding's format already filled in). `binding_id` is
 * null for an inference credential, which is brokered for its provider's host.
 */
export const BrokerBinding = z.object({
  binding_id: z.string().max(64).nullable(),
  placeholder: z.string().min(16).max(128),
  host: z.string().min(1).max(260),
  header: z.string().min(1).max(128),
  value: z.string().max(16_384),
});
export type BrokerBinding = z.infer<typeof BrokerBinding>;

/** What a sandbox is built with: its directory under the runner's root, its environment. */
export const SandboxCreate = z.object({
  kind: z.literal('sandbox.create'),
  sandbox: z.string().min(1).max(64),
  incarnation: z.number().int().min(0),
  /** The conversation the build's stage events belong to. */
  conversation_id: z.string().min(1).max(64),
  /** Variables and secrets for the runtime's environment (never the prompt, never the log). */
  env: z.record(z.string(), z.string()),
  setup_script: z.string().max(100_000).nullable(),
  /**
   * The sandbox's egress policy: `allowed_hosts` (exact `host` or `host:port`, or `*.domain` for
   * its subdomains) is what its runtimes and setup script may reach through the runner's
   * allow-listing proxy; the service has already added the model provider's host and its own.
   * Null or absent: unrestricted. Optional: a runner one release older ignores it.
   */
  network: z
    .object({ allowed_hosts: z.array(z.string().min(1).max(260)).max(600) })
    .nullable()
    .optional(),
  /**
   * The hosts the sandbox's runtimes always reach, whatever its policy: the model provider's
   * and the service's own (`host:port`). An isolated sandbox has no network but the runner's
   * bridges, so these are bridged even when the policy is unrestricted, and they may be on
   * the runner's loopback or a private network, where an unrestricted policy does not lead.
   * Optional: a runner one release older ignores it.
   */
  reach: z.array(z.string().min(1).max(260)).max(10).optional(),
  /**
   * Present when the egress credential broker is on (stage `broker`): the bound secrets of the
   * build's environment (the setup script sees their placeholders). Optional: a runner one
   * release older ignores it, and its sandboxes get the placeholders without a broker.
   */
  broker: z.array(BrokerBinding).max(200).optional(),
  /**
   * The environment's repositories, cloned into `mount_path` under the sandbox (stage `clone`).
   * This and the two fields below are optional: a runner one release older ignores them.
   */
  repositories: z
    .array(z.object({ url: z.string().min(1).max(2000), mount_path: z.string().min(1).max(500) }))
    .max(20)
    .optional(),
  /** The environment's `apt` and `npm` package lists (stage `packages`). */
  packages: z
    .object({
      apt: z.array(z.string().max(200)).max(500).optional(),
      npm: z.array(z.string().max(214)).max(500).optional(),
    })
    .optional(),
  /**
   * The agent's skills: `{name, content}` is written verbatim as `.claude/skills/<name>/SKILL.md`
   * under the sandbox's HOME; `{source, ref?}` is a git repository cloned in stage `clone`.
   */
  skills: z
    .array(
      z.union([
        z.object({ name: z.string().min(1).max(64), content: z.string().max(200_000) }),
        z.object({ source: z.string().min(1).max(500), ref: z.string().min(1).max(200).optional() }),
      ]),
    )
    .max(50)
    .optional(),
  /**
   * Wake a sandbox that was suspended: its directory under the runner's root was kept, so it is
   * adopted as it is (no `provision`, `clone`, `packages` or `setup`; the egress policy is
   * applied again) and the runner closes stage `reattach` (done, or failed when the directory
   * is gone) instead of `sandbox`. Optional: a runner one release older builds it again.
   */
  adopt: z.boolean().optional(),
});
export type SandboxCreateCommand = z.infer<typeof SandboxCreate>;

export const SandboxDestroy = z.object({
  kind: z.literal('sandbox.destroy'),
  sandbox: z.string().min(1).max(64),
  incarnation: z.number().int().min(0),
});

/**
 * The sandbox is idle: its runtimes stop and the runner forgets it, but its directory (the
 * disk) stays, so a later `sandbox.create` with `adopt` wakes it there. Ignored when the
 * runner builds or holds a newer incarnation. Sent only to a runner whose hello names
 * RUNNER_CAN_SUSPEND among its capabilities.
 */
export const SandboxSuspend = z.object({
  kind: z.literal('sandbox.suspend'),
  sandbox: z.string().min(1).max(64),
  incarnation: z.number().int().min(0),
});

/** The hello capability of a runner that takes `sandbox.suspend`. */
export const RUNNER_CAN_SUSPEND = 'sandbox.suspend';

/**
 * A RUNTIME_<NAME>_COMMAND line split into its command and arguments: words separated by
 * spaces, quotes ("..." or '...') grouping words. The service and a runner read it alike.
 */
export function commandLine(line: string): { command: string; args: string[] } {
  const words = [...line.matchAll(/"([^"]*)"|'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2] ?? m[3] ?? '');
  return { command: words[0] ?? '', args: words.slice(1) };
}

/** An MCP server the runtime starts itself: a stdio command (the agent's own servers). */
export const McpStdioServer = z.object({
  name: z.string().min(1).max(64),
  command: z.string().min(1).max(1000),
  args: z.array(z.string().max(4000)).max(100),
});

export type McpStdioServer = z.infer<typeof McpStdioServer>;

/** An MCP server the runtime reaches over HTTP (ACP's McpServerHttp): the service's `svc-team`. */
export const McpHttpServer = z.object({
  type: z.literal('http'),
  name: z.string().min(1).max(64),
  url: z.url().max(2000),
  headers: z.array(z.object({ name: z.string().min(1).max(200), value: z.string().max(4000) })).max(20),
});

export type McpHttpServer = z.infer<typeof McpHttpServer>;

/** An MCP server of a turn's runtime: a stdio command, or an HTTP endpoint. */
export const McpServerEntry = z.union([McpStdioServer, McpHttpServer]);
export type McpServerEntry = z.infer<typeof McpServerEntry>;

/**
 * The runner-agent's subcommand that bridges a stdio MCP client to an HTTP MCP server:
 * `svc-runner mcp-bridge <url>` (runner-agent's mcp-bridge.ts).
 */
export const MCP_BRIDGE_COMMAND = 'mcp-bridge';

/**
 * Runs a turn of a conversation on a built sandbox: the runtime (an ACP agent started with
 * `runtime.command`, kept per conversation across turns) gets the prompt. Its session/update
 * notifications come back as `acp` events, its stderr as `stderr`, and the turn ends with a
 * `turn` stage event whose state is the result and whose data is `{"usage": ...}`; a failed turn's
 * data also carries `code` (TURN_ERROR_CODES) and `error`, the message saying what to fix, and a
 * failure of the model provider is first reported as stage `model` failed with the same two.
 */
export const TurnStart = z.object({
  kind: z.literal('turn.start'),
  sandbox: z.string().min(1).max(64),
  incarnation: z.number().int().min(0),
  conversation_id: z.string().min(1).max(64),
  turn_id: z.string().min(1).max(64),
  prompt: z.string().max(1_000_000),
  /** The turn's bound secrets and brokered inference credential (see SandboxCreate.broker). */
  broker: z.array(BrokerBinding).max(200).optional(),
  runtime: z.object({
    command: z.string().min(1),
    args: z.array(z.string()),
    /**
     * Which runtime this is (`claude`, `codex`, `gemini`, `opencode`), and the tail of `args`
     * that the agent's settings add after the service's command line (RUNTIME_<NAME>_COMMAND).
     * A runner whose own environment sets that variable starts its own command line followed
     * by `settings_args` instead of `command` and `args`; a failure names the runtime's agent
     * package and credential. Optional: a runner one release older runs `command` and `args`.
     * A string, not the list of runtimes, so a runtime added later does not make an older
     * runner refuse the whole command.
     */
    name: z.string().min(1).max(64).optional(),
    settings_args: z.array(z.string()).optional(),
    env: z.record(z.string(), z.string()),
    /**
     * The agent's model as its runtime names it (`claude-sonnet-4-5` for `claude`), selected in
     * the ACP session when the runtime offers a model option. Optional: a runner one release
     * older ignores it.
     */
    model: z.string().min(1).max(200).optional(),
    /**
     * `_meta` for the runtime's `session/new`, in the form that runtime reads (the service
     * puts the agent's system prompt there for `claude`). Optional: an older runner ignores it.
     */
    session_meta: z.record(z.string(), z.unknown()).optional(),
    /**
     * Files the runtime reads from its HOME (the sandbox directory), written before it starts,
     * replacing what is there, by a process of the sandbox's user: the agent's system prompt
     * for runtimes that take it from a file (opencode's `.svc/system-prompt.md`, named in its
     * configuration; Gemini CLI's `.gemini/GEMINI.md`). A path is relative to HOME and stays
     * inside it. Optional: an older runner ignores it (and its runtime gets no system prompt).
     */
    home_files: z
      .array(
        z.object({
          path: z
            .string()
            .max(200)
            .regex(/^(?!\/)(?!.*(?:^|\/)\.\.?(?:\/|$))[A-Za-z0-9._/-]+$/, 'a relative path inside HOME'),
          content: z.string().max(1_000_000),
        }),
      )
      .max(8)
      .optional(),
  }),
  /** The turn is failed with `timeout` after this long. */
  time_limit_ms: z.number().int().min(1000),
  /** Images sent with the prompt (base64), passed to the runtime as ACP image content. */
  images: z
    .array(z.object({ data: z.string(), media_type: z.string().max(100) }))
    .max(64)
    .optional(),
  /**
   * Which permission requests wait for an answer over the API (the agent's `permission_policy`);
   * the others are answered at once with the first allow option. Absent: none wait.
   */
  permission_policy: z
    .object({ default: z.enum(['auto_allow', 'ask']), ask: z.array(z.string().max(200)).max(100) })
    .optional(),
  /** A request that waits this long unanswered is denied (PERMISSION_TIMEOUT_S); absent: 300 s. */
  permission_timeout_ms: z.number().int().min(100).optional(),
  /**
   * How long the runtime stays quiet before the conversation's autonomous turn ends (see
   * AUTONOMOUS_TURN_DATA). Absent: the runner's default (3 s). Optional: an older runner ignores it.
   */
  autonomous_idle_ms: z.number().int().min(100).optional(),
  /**
   * The agent's own MCP servers for the runtime's ACP `session/new`, read when the
   * conversation's runtime starts; passed with `env` empty, so they inherit the runtime's.
   */
  mcp_servers: z.array(McpStdioServer).max(50).optional(),
  /**
   * The service's MCP servers over HTTP (`svc-team` on a team conversation, its sandbox token
   * in `headers`), passed as they are to a runtime whose `initialize` advertises
   * `mcpCapabilities.http`; any other runtime gets a stdio server in each one's place, the
   * runner's bridge to that URL (MCP_BRIDGE_COMMAND). A field of its own so that a runner one
   * release older, which ignores it, still runs the turn (without those servers).
   */
  mcp_http_servers: z.array(McpHttpServer).max(10).optional(),
});

export type TurnStartCommand = z.infer<typeof TurnStart>;

/**
 * Autonomous turns: a runtime that speaks while none of its conversation's turns runs (an
 * agent that keeps working after its answer) gets a turn the runner opens, so its output is
 * never outside a turn. The runner names it (`trn_` and a ULID) and reports it like any turn:
 * stage `turn` started with this data, the output under its id, then stage `turn` done
 * (`{"usage": null, "stop_reason": "idle" | "prompt" | "closed"}`) once the runtime is quiet
 * for `autonomous_idle_ms`, before a `turn.start` of the conversation runs, or when the
 * conversation closes; `turn.interrupt` naming it ends it `interrupted`, and the last
 * `turn.start`'s `time_limit_ms` `timeout` (both send the runtime `session/cancel`). The
 * service records it with origin `autonomous`. A service one release
 * older finds no record of the id and keeps the output in the log under it.
 */
export const AUTONOMOUS_TURN_DATA = { origin: 'autonomous' } as const;

/** Whether a runner event opens an autonomous turn (see AUTONOMOUS_TURN_DATA). */
export function opensAutonomousTurn(e: Pick<RunnerEvent, 'kind' | 'stage' | 'state' | 'data' | 'turn_id'>): boolean {
  if (e.kind !== 'stage' || e.stage !== 'turn' || e.state !== 'started' || !e.turn_id || !e.data) return false;
  try {
    return (JSON.parse(e.data) as { origin?: unknown } | null)?.origin === AUTONOMOUS_TURN_DATA.origin;
  } catch {
    return false;
  }
}

export const TurnInterrupt = z.object({
  kind: z.literal('turn.interrupt'),
  sandbox: z.string().min(1).max(64),
  conversation_id: z.string().min(1).max(64),
  turn_id: z.string().min(1).max(64),
});

/**
 * The conversation has ended: its running turn is cancelled and its runtime stops. The
 * sandbox stays (it may be persistent or shared; `sandbox.destroy` removes it).
 */
export const ConversationClose = z.object({
  kind: z.literal('conversation.close'),
  sandbox: z.string().min(1).max(64),
  conversation_id: z.string().min(1).max(64),
});

/** The answer to a permission request that waits (SPEC launch rule 5), given over the API. */
export const PermissionAnswerCommand = z.object({
  kind: z.literal('permission.answer'),
  sandbox: z.string().min(1).max(64),
  conversation_id: z.string().min(1).max(64),
  request_id: z.string().min(1).max(64),
  option_id: z.string().min(1).max(200),
});

export const RunnerCommandBody = z.discriminatedUnion('kind', [
  SandboxCreate,
  SandboxDestroy,
  SandboxSuspend,
  TurnStart,
  TurnInterrupt,
  ConversationClose,
  PermissionAnswerCommand,
]);
export type RunnerCommandBody = z.infer<typeof RunnerCommandBody>;

/** A command, numbered per connection, for the connection `epoch` (a stale one is refused). */
export const ServiceCommand = z.object({
  t: z.literal('command'),
  n: z.number().int().min(1),
  epoch: z.number().int().min(1),
  command: RunnerCommandBody,
});

/**
 * How far the log holds a sandbox incarnation's output (appended: live watchers have it; the
 * runner sends on from `hwm + 1`). The runner still keeps it until `durable`.
 */
export const ServiceAppended = z.object({
  t: z.literal('appended'),
  sandbox: z.string(),
  incarnation: z.number().int().min(0),
  hwm: z.number().int().min(0),
});

/** The Postgres copy holds the incarnation's output up to `seq`: the runner may forget it. */
export const ServiceDurable = z.object({
  t: z.literal('durable'),
  sandbox: z.string(),
  incarnation: z.number().int().min(0),
  seq: z.number().int().min(0),
});

/**
 * The service will never take this sandbox incarnation's output (the sandbox is no longer on
 * this runner: deleted with its account, say): the runner forgets what it keeps of it, on
 * disk too, and stops its runtimes, instead of resending it at every start.
 */
export const ServiceDiscard = z.object({
  t: z.literal('discard'),
  sandbox: z.string(),
  incarnation: z.number().int().min(0),
  reason: z.string().max(500),
});

export const ServiceMessage = z.discriminatedUnion('t', [
  ServiceWelcome,
  ServiceCommand,
  ServiceAppended,
  ServiceDurable,
  ServiceDiscard,
]);

/**
 * Permission requests in the log. The runner names each request (`prq_` and random hex) and
 * reports it as stage `request`: `started` when it waits for an answer (data
 * `PermissionRequestStarted`), `done` when it is resolved (data `PermissionRequestDone`). The
 * request itself is the `acp` event whose data is the `session/request_permission` params plus
 * `requestId` (a `permission_request` block). A request the policy answers at once has no
 * `started`, only its `acp` event and a `done` with resolution `policy`.
 */
export const PERMISSION_REQUEST_STAGE = 'request';
export const PERMISSION_REQUEST_ID = /^prq_[A-Za-z0-9]{8,60}$/;

export const PermissionOption = z.object({
  optionId: z.string().max(200),
  name: z.string().max(500),
  kind: z.string().max(32),
});
export type PermissionOption = z.infer<typeof PermissionOption>;

export const PermissionRequestStarted = z.object({
  request_id: z.string().regex(PERMISSION_REQUEST_ID),
  options: z.array(PermissionOption).max(32),
});
export type PermissionRequestStarted = z.infer<typeof PermissionRequestStarted>;

/**
 * How a request was resolved: `answered` over the API, `policy` by the permission policy,
 * `timeout` unanswered for PERMISSION_TIMEOUT_S, `turn_end` still open when its turn ended,
 * `interrupted` by an interrupt or the turn's time limit. The last three deny: the runtime
 * gets the first reject option, or `cancelled` when none was offered (`option_id` null).
 */
export const PERMISSION_RESOLUTIONS = ['answered', 'policy', 'timeout', 'turn_end', 'interrupted'] as const;
export type PermissionResolution = (typeof PERMISSION_RESOLUTIONS)[number];

export const PermissionRequestDone = z.object({
  request_id: z.string().regex(PERMISSION_REQUEST_ID),
  resolution: z.enum(PERMISSION_RESOLUTIONS),
  option_id: z.string().max(200).nullable(),
});
export type PermissionRequestDone = z.infer<typeof PermissionRequestDone>;

/** The log producer of a sandbox incarnation's output. */
export function sandboxProducer(sandbox: string, incarnation: number): string {
  return `sbx:${sandbox}:${incarnation}`;
}
export type ServiceMessage = z.infer<typeof ServiceMessage>;

// Plain maps, no records or extensions: a runner of another language can speak this too.
const packr = new Packr({ useRecords: false, moreTypes: false });

export function encodeFrame(message: RunnerMessage | ServiceMessage): Uint8Array {
  return packr.pack(message);
}

/**
 * Decodes and validates one frame against `schema`; undefined when it is not msgpack or not
 * a message of the protocol (the caller closes with `protocol_error`).
 */
export function decodeFrame<S extends z.ZodType>(schema: S, frame: Uint8Array): z.infer<S> | undefined {
  let value: unknown;
  try {
    value = packr.unpack(frame);
  } catch {
    return undefined;
  }
  const parsed = schema.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}
