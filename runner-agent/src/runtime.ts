import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { basename } from 'node:path';
import { Readable, Writable } from 'node:stream';
// The /unstable entrypoint of the exactly pinned SDK: ACP v1 carries a turn's token usage on the
// `session/prompt` response only as an unstable field (`PromptResponse.usage`), which the stable
// entrypoint's types leave out. The wire protocol is the same ACP v1 either way.
import * as acp from '@agentclientprotocol/sdk/unstable';
import type { McpServerEntry } from '@svc/core';
import { type Confine, type Confined, signalConfined, spawnConfined } from './isolation.ts';
import { acpMcpServers } from './mcp-bridge.ts';
import { foldDumpedObjects } from './stderr-lines.ts';
import { AGENT_VERSION } from './version.ts';

/** The answer to one `session/request_permission`: an option the agent offered, or none. */
export type PermissionAnswer = { outcome: 'selected'; optionId: string } | { outcome: 'cancelled' };

/** A turn's token counts, as the agent reported them on its `session/prompt` response. */
export interface TurnUsage {
  input: number;
  output: number;
  cache_read?: number;
  cache_write?: number;
}

export interface PromptResult {
  /** ACP's stop reason: `end_turn`, `max_tokens`, `max_turn_requests`, `refusal`, `cancelled`. */
  stopReason: string;
  /** Null when the agent did not report usage (the field is optional and unstable in ACP v1). */
  usage: TurnUsage | null;
}

export interface AcpRuntimeOptions {
  command: string;
  args: string[];
  cwd: string;
  /** The agent's whole environment. Only PATH and HOME are taken from ours, and only when absent. */
  env: Record<string, string>;
  /**
   * The params of each `session/update` notification, exactly as received, in the order the
   * agent sent them. Every update the agent sent before answering a prompt has been delivered
   * by the time that prompt resolves. Must not throw: an exception ends the connection.
   */
  onUpdate(update: unknown): void;
  /**
   * The agent's stderr, one line at a time (without the line ending), an object it dumped over
   * many lines folded into one (foldDumpedObjects). A pipe of its own, so a line has no order
   * with the updates: it may come after the response of its turn.
   */
  onStderr(line: string): void;
  /**
   * The params of a `session/request_permission` request, as received. Its answer goes back to
   * the agent; `cancel()` answers every request still open with `cancelled` and ignores the
   * later answer. A rejection is sent to the agent as a JSON-RPC error.
   */
  onPermission(request: unknown): Promise<PermissionAnswer>;
  /**
   * The turn's MCP servers for `session/new` (see acpMcpServers: an HTTP one reaches a runtime
   * without `mcpCapabilities.http` through the runner's stdio bridge).
   */
  mcpServers?: McpServerEntry[];
  /**
   * `_meta` of `session/new`: what a runtime takes there beyond ACP's fields (claude-agent-acp
   * reads `systemPrompt`, a string or `{append}`).
   */
  sessionMeta?: Record<string, unknown>;
  /**
   * The model, as the agent names it. When the new session offers a config option of category
   * `model`, it is chosen there (`session/set_config_option`); an agent without one reads its
   * model from its own environment or configuration.
   */
  model?: string;
  /** The user and group the process runs as (the runner's `--run-as`); absent: the runner's own. */
  user?: { uid: number; gid: number };
  /** The sandbox's confinement: the agent runs in its namespaces (see Isolation). */
  confine?: Confine | undefined;
  /** Files of the command line the operator set (not the agent's settings), for `confine`. */
  commandFiles?: readonly string[];
}

/** How many of the last stderr lines an unexpected exit quotes. */
const STDERR_TAIL_LINES = 20;
const STDERR_TAIL_LINE_CHARS = 1000;
const STDERR_MAX_LINE_CHARS = 64 * 1024;
/** close(): how long the group has between SIGTERM and SIGKILL. */
const KILL_GRACE_MS = 2000;
/** After a request fails, how long to wait for the exit that probably caused it. */
const EXIT_SETTLE_MS = 1000;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function isSessionUpdate(message: acp.AnyMessage): message is acp.AnyNotification {
  return 'method' in message && message.method === acp.methods.client.session.update && !('id' in message);
}

/** True while any process of the group `pgid` exists (zombies included, where the OS counts them). */
function groupExists(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: the group is already gone.
  }
}

function turnUsage(usage: acp.Usage | null | undefined): TurnUsage | null {
  if (!usage || typeof usage.inputTokens !== 'number' || typeof usage.outputTokens !== 'number') return null;
  const out: TurnUsage = { input: usage.inputTokens, output: usage.outputTokens };
  if (typeof usage.cachedReadTokens === 'number') out.cache_read = usage.cachedReadTokens;
  if (typeof usage.cachedWriteTokens === 'number') out.cache_write = usage.cachedWriteTokens;
  return out;
}

/** The agent's command could not be started (`errno` says why: ENOENT when it is not installed). */
export class RuntimeSpawnError extends Error {
  readonly errno: string | undefined;
  constructor(command: string, cause: NodeJS.ErrnoException) {
    super(`cannot start ${command}: ${cause.message}`);
    this.errno = cause.code;
  }
}

/**
 * One ACP agent process (a runtime such as `claude-agent-acp` or `gemini --experimental-acp`)
 * and its one session, driven over stdio as an ACP client (DESIGN "The life of a prompt", 4).
 *
 * The process runs in its own process group with exactly the environment it is given, so a
 * secret reaches it only when the caller puts it there and `close()` can end everything it
 * started. The client offers no file system and no terminal: the agent works in `cwd` with its
 * own tools. If the process exits on its own, the prompt in flight rejects with an Error naming
 * the exit code or signal and quoting the last stderr lines.
 */
export class AcpRuntime {
  readonly pid: number;
  private session = '';
  private agentCapabilities: acp.AgentCapabilities = {};
  private readonly connection: acp.ClientConnection;
  private readonly label: string;
  private readonly stderrTail: string[] = [];
  private exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  private readonly exited: Promise<void>;
  private closing: Promise<void> | undefined;
  private turnRunning = false;
  /** Answers of the permission requests still open, so `cancel()` can answer them. */
  private readonly openPermissions = new Set<(answer: PermissionAnswer) => void>();
  /** Whether the process is bubblewrap confining the agent (see Confined.confined). */
  private readonly confined: boolean;

  /** The id of the session `start()` opened (ACP `session/new`). */
  get sessionId(): string {
    return this.session;
  }

  private constructor(child: ChildProcessWithoutNullStreams, options: AcpRuntimeOptions, confined: boolean) {
    this.pid = child.pid as number;
    this.confined = confined;
    this.label = `ACP agent ${basename(options.command)} (pid ${this.pid})`;

    let partial = '';
    const line = (text: string) => {
      const clean = text.endsWith('\r') ? text.slice(0, -1) : text;
      this.stderrTail.push(clean.slice(0, STDERR_TAIL_LINE_CHARS));
      if (this.stderrTail.length > STDERR_TAIL_LINES) this.stderrTail.shift();
      options.onStderr(clean);
    };
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk: string) => {
      const lines = (partial + chunk).split('\n');
      partial = lines.pop() ?? '';
      for (const l of foldDumpedObjects(lines)) line(l);
      // A line without end is passed on in pieces rather than held without bound.
      if (partial.length > STDERR_MAX_LINE_CHARS) {
        line(partial);
        partial = '';
      }
    });
    const stderrEnded = new Promise<void>((resolve) =>
      child.stderr.on('close', () => {
        if (partial) line(partial);
        partial = '';
        resolve();
      }),
    );
    // Writes to an agent that has gone fail the connection; they must not crash us.
    child.stdin.on('error', () => {});

    this.exited = new Promise((resolve) => {
      child.once('exit', async (code, signal) => {
        this.exit = { code, signal };
        // Its last words may still be in the pipe (unless a grandchild holds stderr open).
        await Promise.race([stderrEnded, sleep(200)]);
        this.connection.close(this.exitError());
        resolve();
      });
    });

    const wire = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout) as ReadableStream);
    // Updates are taken off the wire in arrival order, before the SDK dispatches anything:
    // its handlers run concurrently, and a prompt's response could otherwise overtake the last
    // updates of its turn. The SDK has no handler for them and ignores them.
    const readable = wire.readable.pipeThrough(
      new TransformStream<acp.AnyMessage, acp.AnyMessage>({
        transform(message, controller) {
          if (isSessionUpdate(message)) options.onUpdate(message.params);
          controller.enqueue(message);
        },
      }),
    );
    this.connection = acp
      .client({ name: 'svc-runner' })
      // The one client method offered; raw params, so the caller sees what the agent sent.
      .onRequest('*', async ({ method, params, signal }) => {
        if (method !== acp.methods.client.session.requestPermission) throw acp.RequestError.methodNotFound(method);
        return { outcome: await this.askPermission(options, params, signal) };
      })
      .connect({ readable, writable: wire.writable });
  }

  /**
   * Spawns the agent and opens its session: `initialize` (ACP v1, no fs, no terminal), then
   * `session/new` in `cwd`. Rejects, with the process gone, when the command cannot start (a
   * RuntimeSpawnError), the agent speaks another protocol version, or either request fails.
   */
  static async start(options: AcpRuntimeOptions): Promise<AcpRuntime> {
    const env = { ...options.env };
    for (const key of ['PATH', 'HOME'] as const) {
      if (env[key] === undefined && process.env[key] !== undefined) env[key] = process.env[key];
    }
    let run: Confined = { command: options.command, args: options.args, cwd: options.cwd, ...options.user };
    try {
      if (options.confine) run = options.confine(options.command, options.args, options.cwd, env, options.commandFiles);
    } catch (err) {
      throw new RuntimeSpawnError(options.command, err as NodeJS.ErrnoException);
    }
    const child = spawnConfined(run, {
      env,
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
    }) as ChildProcessWithoutNullStreams;
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.on('error', (err) => reject(new RuntimeSpawnError(options.command, err)));
    });
    const runtime = new AcpRuntime(child, options, run.confined === true);
    try {
      await runtime.open(options);
    } catch (err) {
      await runtime.close();
      throw err;
    }
    return runtime;
  }

  private async open(options: AcpRuntimeOptions): Promise<void> {
    const agent = this.connection.agent;
    const init = await this.settled(
      agent.request(acp.methods.agent.initialize, {
        protocolVersion: acp.PROTOCOL_VERSION,
        clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
        clientInfo: { name: 'svc-runner', version: AGENT_VERSION },
      }),
    );
    if (init.protocolVersion !== acp.PROTOCOL_VERSION) {
      throw new Error(`${this.label} speaks ACP version ${init.protocolVersion}; we speak ${acp.PROTOCOL_VERSION}`);
    }
    this.agentCapabilities = init.agentCapabilities ?? {};
    const session = await this.settled(
      agent.request(acp.methods.agent.session.new, {
        cwd: options.cwd,
        mcpServers: acpMcpServers(
          options.mcpServers ?? [],
          this.agentCapabilities.mcpCapabilities?.http === true,
        ) as acp.McpServer[],
        ...(options.sessionMeta ? { _meta: options.sessionMeta } : {}),
      }),
    );
    this.session = session.sessionId;
    if (options.model) await this.chooseModel(options.model, session.configOptions ?? []);
  }

  /**
   * Selects `model` in the session's `model` config option. Some agents pick a model of their
   * own when the session opens, whatever their environment says (claude-agent-acp selects its
   * first listed model, "default"), so this is the one way the choice is sure to hold. Only an
   * exact value is sent: an agent may match other strings loosely to a different model, so a
   * model it does not list fails the start, naming what it offers.
   */
  private async chooseModel(model: string, configOptions: acp.SessionConfigOption[]): Promise<void> {
    const option = configOptions.find((o) => o.category === 'model');
    if (option?.type !== 'select' || option.currentValue === model) return;
    const values = option.options.flatMap((o) => ('group' in o ? o.options : [o])).map((o) => o.value);
    if (!values.includes(model)) {
      throw new Error(`${this.label} does not offer model ${model}; it offers: ${values.join(', ')}`);
    }
    await this.settled(
      this.connection.agent.request(acp.methods.agent.session.setConfigOption, {
        sessionId: this.session,
        configId: option.id,
        value: model,
      }),
    );
  }

  /**
   * Runs one turn (`session/prompt`) and resolves with the agent's stop reason and usage; the
   * turn's updates go to `onUpdate` as they come. One turn at a time: a second call while one
   * runs throws. Images need the agent's `promptCapabilities.image`; without it this throws
   * rather than send what the agent refuses.
   */
  async prompt(text: string, images: { mimeType: string; data: string }[] = []): Promise<PromptResult> {
    if (this.turnRunning) throw new Error(`${this.label} is already running a prompt`);
    if (images.length > 0 && !this.agentCapabilities.promptCapabilities?.image) {
      throw new Error(`${this.label} does not accept images (no promptCapabilities.image)`);
    }
    const prompt: acp.ContentBlock[] = [
      { type: 'text', text },
      ...images.map((i) => ({ type: 'image' as const, mimeType: i.mimeType, data: i.data })),
    ];
    this.turnRunning = true;
    try {
      const response = await this.settled(
        this.connection.agent.request(acp.methods.agent.session.prompt, { sessionId: this.sessionId, prompt }),
      );
      return { stopReason: response.stopReason, usage: turnUsage(response.usage) };
    } finally {
      this.turnRunning = false;
    }
  }

  /**
   * Interrupts the running turn (`session/cancel`): the agent ends it with stopReason
   * `cancelled`. Permission requests still open are answered `cancelled`, as ACP asks of the
   * client. Never throws; nothing happens once the agent is gone.
   */
  async cancel(): Promise<void> {
    const sent = this.connection.agent
      .notify(acp.methods.agent.session.cancel, { sessionId: this.sessionId })
      .catch(() => {});
    for (const answer of this.openPermissions) answer({ outcome: 'cancelled' });
    this.openPermissions.clear();
    await sent;
  }

  /**
   * Ends the agent: SIGTERM to its whole process group (confined: to every process of its
   * sandbox's), SIGKILL to the group if anything of it is left after 2 s. Resolves once the
   * agent process has exited. Idempotent.
   */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.connection.close(new Error(`${this.label} was closed`));
      if (this.confined) signalConfined(this.pid, 'SIGTERM');
      else signalGroup(this.pid, 'SIGTERM');
      const deadline = Date.now() + KILL_GRACE_MS;
      while ((this.exit === undefined || groupExists(this.pid)) && Date.now() < deadline) await sleep(20);
      // A zombie left to a parent that does not reap counts as a member; SIGKILL is harmless then.
      if (this.exit === undefined || groupExists(this.pid)) signalGroup(this.pid, 'SIGKILL');
      await this.exited;
    })();
    return this.closing;
  }

  /**
   * A request's outcome, except that a failure caused by the agent exiting is reported as
   * that exit: the connection also fails when the agent's stdout ends, and the exit code and
   * stderr say why far better than "connection closed".
   */
  private async settled<T>(request: Promise<T>): Promise<T> {
    try {
      return await request;
    } catch (err) {
      if (this.exit === undefined && this.closing === undefined)
        await Promise.race([this.exited, sleep(EXIT_SETTLE_MS)]);
      if (this.exit !== undefined && this.closing === undefined) throw this.exitError();
      throw err;
    }
  }

  private exitError(): Error {
    if (this.closing) return new Error(`${this.label} was closed`);
    const how = this.exit?.signal ? `was killed by ${this.exit.signal}` : `exited with code ${this.exit?.code}`;
    const tail = this.stderrTail.length
      ? `; its last stderr lines:\n${this.stderrTail.join('\n')}`
      : ' and wrote nothing to stderr';
    return new Error(`${this.label} ${how}${tail}`);
  }

  private askPermission(options: AcpRuntimeOptions, request: unknown, signal: AbortSignal): Promise<PermissionAnswer> {
    return new Promise<PermissionAnswer>((resolve, reject) => {
      const answer = (a: PermissionAnswer) => {
        this.openPermissions.delete(answer);
        resolve(a);
      };
      this.openPermissions.add(answer);
      // The agent may withdraw the request ($/cancel_request).
      signal.addEventListener('abort', () => answer({ outcome: 'cancelled' }), { once: true });
      options.onPermission(request).then(answer, (err) => {
        this.openPermissions.delete(answer);
        reject(err);
      });
    });
  }
}
