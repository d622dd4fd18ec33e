import { createHash, randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { hostname as osHostname } from 'node:os';
import { join } from 'node:path';
import {
  decodeFrame,
  encodeFrame,
  RUNNER_CAN_SUSPEND,
  RUNNER_CLOSE,
  RUNNER_CONNECT_PATH,
  RUNNER_PROTOCOL_VERSION,
  type RunnerCommandBody,
  type RunnerEgressRow,
  type RunnerEvent,
  type RunnerMessage,
  ServiceMessage,
} from '@svc/core';
import WebSocket from 'ws';
import type { EgressGrant } from './egress-proxy.ts';
import { Isolation, type IsolationMode } from './isolation.ts';
import { RunnerEgress } from './network.ts';
import { OutputLog, type OutputLogOptions } from './output.ts';
import type { RunAs } from './run-as.ts';
import { type RuntimeCommands, withLocalRuntimeCommand } from './runtime-commands.ts';
import { buildSandbox, type Sandbox, sandboxDir, sandboxesOnDisk } from './sandbox.ts';
import { recoverSpool } from './spool.ts';
import { type TurnReport, Turns } from './turns.ts';
import { AGENT_VERSION } from './version.ts';

/**
 * At most this many egress log rows wait to be sent (those of a time disconnected among them);
 * more are dropped, and counted, until they go.
 */
const EGRESS_ROWS_HELD = 5000;

/** How long a runner whose token another live process holds waits between tries (about). */
const TAKEN_RETRY_MS = 5000;

export interface AgentOptions {
  /** The service's base URL (http(s)://, or ws(s)://). */
  url: string;
  token: string;
  /** The directory sandboxes live under. */
  root: string;
  /** `--allow-apt`: builds may install the environment's apt packages on this machine. */
  allowApt?: boolean;
  hostname?: string;
  /** The unprivileged user runtimes and setup scripts run as (`--run-as`; needs root). */
  runAs?: RunAs;
  /**
   * How sandboxes are isolated (`--isolation`): a mode, probed at start, or the Isolation the
   * caller probed. Default `namespaces`.
   */
  isolation?: IsolationMode | Isolation;
  /** Paths an isolated sandbox does not see besides the root and HOME (the service's DATA_DIR). */
  hidden?: string[];
  /** Reconnect backoff: first delay and ceiling (exponential with full jitter between). */
  backoffMs?: { first: number; max: number };
  /**
   * Output held in memory per sandbox incarnation (default 8 MiB, 50,000 events); beyond it
   * events are read back from the spool under `<root>/spool/<token key>` as they are sent.
   */
  outputMemory?: { bytes?: number; events?: number };
  /** Runtime command lines set on this machine; they replace the service's (runtime-commands.ts). */
  runtimeCommands?: RuntimeCommands;
  /**
   * Started by the service's `local` sandbox provider (`--local-provider`): its turns run the
   * service's RUNTIME_<NAME>_COMMAND lines, so a missing agent command names the service's
   * setting, not this machine's.
   */
  localProvider?: boolean;
}

/** What the agent reports as it goes; the CLI prints these in plain words. */
export type AgentEvent =
  | { type: 'connecting'; url: string; attempt: number }
  | { type: 'connected'; runnerId: string; epoch: number; reconnected: boolean }
  | { type: 'disconnected'; code: number; reason: string; retryInMs: number }
  | { type: 'sandbox'; id: string; state: 'ready' | 'failed' | 'destroyed' | 'suspended'; message?: string }
  | ({ type: 'turn' } & TurnReport)
  /** The spool held output a previous process had not seen made durable; it is sent again. */
  | { type: 'recovered'; incarnations: number; events: number; cutBytes: number }
  /** An event could not be written to the spool (a full disk): it is lost, numbering goes on. */
  | { type: 'output_lost'; sandbox: string; message: string }
  | { type: 'output_discarded'; sandbox: string; events: number; reason: string }
  /** Egress log rows dropped while EGRESS_ROWS_HELD of them waited (a long time disconnected). */
  | { type: 'egress_dropped'; rows: number }
  | { type: 'stopped'; reason: AgentStop; message: string };

/** Why the agent stopped for good (each is an exit code of the CLI). */
export type AgentStop = 'bad_url' | 'bad_token' | 'unreachable' | 'revoked' | 'refused' | 'closed';

/** The WebSocket URL of the runner endpoint under a base URL; throws on anything else. */
export function connectUrl(base: string): string {
  let u: URL;
  try {
    u = new URL(base);
  } catch {
    throw new Error(`not a URL: ${base}`);
  }
  const scheme = { 'http:': 'ws:', 'https:': 'wss:', 'ws:': 'ws:', 'wss:': 'wss:' }[u.protocol];
  if (!scheme) throw new Error(`the URL must start with http(s):// or ws(s):// (got ${u.protocol}//)`);
  u.protocol = scheme;
  u.pathname = `${u.pathname.replace(/\/+$/, '')}${RUNNER_CONNECT_PATH}`;
  u.search = '';
  u.hash = '';
  return u.toString();
}

/**
 * Where a runner's spool lives: one directory per runner token under the root, because
 * several runners may share a root (the service's local runner-agents share one per
 * account, each with its own token) and a runner may resend only its own sandboxes' output.
 * A restart with the same token finds it again. Named by a hash: the token stays secret.
 */
export function spoolDir(root: string, token: string): string {
  return join(root, 'spool', createHash('sha256').update(token).digest('hex').slice(0, 16));
}

/** How long after connecting the service's welcome may take before the runner tries again. */
const WELCOME_TIMEOUT_MS = 15_000;
/** How long a stopping runner waits for the sandbox destroys under way to finish. */
const DESTROY_WAIT_MS = 10_000;

/**
 * The runner's connection to the service: connects out, says hello, keeps heartbeats, and
 * reconnects with exponential backoff and jitter after a connection that had been accepted
 * drops. While another process holds a live connection with the same token it waits, trying
 * again every 5 s or so (one token serves one machine; the one connected keeps it). It stops
 * for good, with a reason, when the service refuses the token, the runner is deleted, or the
 * very first connection cannot be made (a wrong URL should fail loudly, not retry forever).
 */
export class RunnerAgent {
  readonly instance = randomBytes(12).toString('hex');
  private ws: WebSocket | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  private retry: NodeJS.Timeout | undefined;
  private everConnected = false;
  private attempt = 0;
  private stopping = false;
  private readonly url: string;
  /** The accepted connection's epoch (0 while not connected); commands carry it. */
  private epoch = 0;
  private readonly sandboxes = new Map<string, Sandbox>();
  /** Each sandbox's build, which its turns wait for. */
  private readonly building = new Map<string, Promise<Sandbox>>();
  /** The incarnation each build in `building` is of. */
  private readonly incarnations = new Map<string, number>();
  /**
   * A destroy or suspension of a sandbox under way: its next build waits for it, so what it
   * stops (runtimes, the egress grant, the directory) is not the new build's.
   */
  private readonly ending = new Map<string, Promise<void>>();
  /** Destroys under way: a stop waits for them (up to DESTROY_WAIT_MS), so a told destroy is done. */
  private readonly destroying = new Set<Promise<void>>();
  private readonly turns: Turns;
  private readonly egress: RunnerEgress;
  private readonly isolation: Promise<Isolation>;
  /** Refusals already reported, per conversation, turn and host: one line each. */
  private readonly refusals = new Set<string>();
  /** Output per sandbox incarnation, kept until durable. */
  private readonly outputs = new Map<string, OutputLog>();
  private flushQueued = false;
  private outputClosed = false;
  readonly done: Promise<{ reason: AgentStop; message: string }>;
  private finish!: (r: { reason: AgentStop; message: string }) => void;

  constructor(
    private readonly options: AgentOptions,
    private readonly report: (event: AgentEvent) => void = () => {},
  ) {
    this.url = connectUrl(options.url);
    this.turns = new Turns(
      (sandbox, incarnation) => (e) => this.emit(sandbox, incarnation, e),
      (report) => this.report({ type: 'turn', ...report }),
      options.localProvider ? 'service' : 'runner',
    );
    this.egress = new RunnerEgress(
      options.runAs ?? null,
      (grant, host, reason) => this.refused(grant, host, reason),
      (source, row) => this.egressRow(source.conversationId, row),
    );
    const isolation = options.isolation ?? 'namespaces';
    this.isolation =
      isolation instanceof Isolation
        ? Promise.resolve(isolation)
        : Isolation.probe({
            mode: isolation,
            root: options.root,
            ...(options.hidden ? { hidden: options.hidden } : {}),
            ...(options.runAs ? { runAs: options.runAs } : {}),
          });
    this.done = new Promise((resolve) => {
      this.finish = resolve;
    });
  }

  start(): this {
    this.recoverOutput();
    this.connect();
    return this;
  }

  private get outputOptions(): OutputLogOptions {
    return {
      dir: spoolDir(this.options.root, this.options.token),
      memoryBytes: this.options.outputMemory?.bytes,
      memoryEvents: this.options.outputMemory?.events,
    };
  }

  /**
   * Output an earlier process under the same root left in the spool and never saw made
   * durable: it goes out once connected, and each incarnation's numbering continues after it.
   */
  private recoverOutput(): void {
    const recovered = recoverSpool(this.outputOptions.dir);
    for (const log of OutputLog.recover(recovered, this.outputOptions)) {
      this.outputs.set(`${log.sandbox}:${log.incarnation}`, log);
    }
    const events = recovered.reduce((n, r) => n + r.records, 0);
    const cutBytes = recovered.reduce((n, r) => n + r.cutBytes, 0);
    if (events || cutBytes) {
      const incarnations = recovered.filter((r) => r.records > 0).length;
      this.report({ type: 'recovered', incarnations, events, cutBytes });
    }
  }

  /** Stops: closes the connection and reconnects no more. */
  stop(message = 'stopped'): void {
    this.end('closed', message);
  }

  private end(reason: AgentStop, message: string): void {
    if (this.stopping) return;
    this.stopping = true;
    clearInterval(this.heartbeat);
    clearTimeout(this.retry);
    clearTimeout(this.egressTimer);
    this.ws?.close(1000, 'runner stopping');
    // Spool files close once the runtimes are gone: their last words are kept for the next start.
    void this.turns.closeAll().finally(() => {
      this.outputClosed = true;
      for (const log of this.outputs.values()) log.close();
    });
    void this.egress.close();
    this.report({ type: 'stopped', reason, message });
    // A destroy the service was told is done before the process ends (an account deletion
    // sends its destroys, then closes the connection as revoked).
    let timer: NodeJS.Timeout | undefined;
    const bound = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, DESTROY_WAIT_MS);
    });
    void Promise.race([Promise.allSettled([...this.destroying]), bound]).then(() => {
      clearTimeout(timer);
      this.finish({ reason, message });
    });
  }

  private send(message: RunnerMessage): void {
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(encodeFrame(message));
  }

  private connect(): void {
    this.attempt++;
    this.report({ type: 'connecting', url: this.url, attempt: this.attempt });
    const ws = new WebSocket(this.url, {
      headers: { authorization: `Bearer ${this.options.token}` },
      handshakeTimeout: 10_000,
      maxPayload: 16 * 1024 * 1024,
    });
    this.ws = ws;
    let accepted = false;

    // Set when the answer to the upgrade was already dealt with; the close that follows is not news.
    let handled = false;
    // What went wrong with this connection, for the report of its close (1006 says only that
    // it was not closed cleanly).
    let failure = '';
    ws.on('unexpected-response', (_req, res) => {
      const status = res.statusCode ?? 0;
      handled = true;
      res.resume();
      ws.terminate();
      if (status === 401) return this.end('bad_token', 'the service refused the runner token (401)');
      if (status === 404) return this.end('bad_url', `no runner endpoint at ${this.url} (404)`);
      if (!this.everConnected) return this.end('refused', `the service answered ${status} to the connection`);
      this.scheduleReconnect(1006, `the service answered ${status}`);
    });
    ws.on('open', () => {
      // A connection the service never welcomes is given up and tried again.
      const welcomeTimer = setTimeout(() => {
        if (accepted || this.ws !== ws) return;
        failure = `no welcome within ${WELCOME_TIMEOUT_MS / 1000} s`;
        ws.terminate();
      }, WELCOME_TIMEOUT_MS);
      welcomeTimer.unref();
      ws.once('close', () => clearTimeout(welcomeTimer));
      this.send({
        t: 'hello',
        protocol: RUNNER_PROTOCOL_VERSION,
        version: AGENT_VERSION,
        instance: this.instance,
        hostname: this.options.hostname ?? osHostname(),
        root: this.options.root,
        capabilities: [RUNNER_CAN_SUSPEND],
        sandboxes: [...this.sandboxes.values()].map((b) => ({ id: b.id, incarnation: b.incarnation })),
        // What an earlier process built: the service wakes them on their kept disk when asked.
        kept: sandboxesOnDisk(this.options.root)
          .filter((id) => !this.building.has(id))
          .slice(0, 10_000),
      });
    });
    ws.on('message', (data, isBinary) => {
      if (!isBinary) return;
      const message = decodeFrame(ServiceMessage, new Uint8Array(data as Buffer));
      if (!message) return;
      switch (message.t) {
        case 'welcome': {
          accepted = true;
          const reconnected = this.everConnected;
          this.everConnected = true;
          this.attempt = 0;
          this.epoch = message.epoch;
          clearInterval(this.heartbeat);
          this.heartbeat = setInterval(() => this.send({ t: 'heartbeat' }), message.heartbeat_ms);
          this.report({ type: 'connected', runnerId: message.runner_id, epoch: message.epoch, reconnected });
          // Whatever is not durable yet goes again; the log drops what it already holds.
          for (const log of this.outputs.values()) log.rewind();
          this.flush();
          this.sendEgressSoon();
          break;
        }
        case 'appended':
          this.outputs.get(`${message.sandbox}:${message.incarnation}`)?.appended(message.hwm);
          this.flush();
          break;
        case 'durable':
          this.outputs.get(`${message.sandbox}:${message.incarnation}`)?.durable(message.seq);
          break;
        case 'discard': {
          const key = `${message.sandbox}:${message.incarnation}`;
          const log = this.outputs.get(key);
          this.outputs.delete(key);
          const events = log?.discard() ?? 0;
          this.report({ type: 'output_discarded', sandbox: message.sandbox, events, reason: message.reason });
          // Whatever still runs there speaks for a sandbox the service no longer has.
          if (this.sandboxes.get(message.sandbox)?.incarnation === message.incarnation) {
            void this.destroy(message.sandbox);
          }
          break;
        }
        case 'command':
          // A command for an older connection is not ours to act on.
          if (message.epoch !== this.epoch) break;
          this.send({ t: 'ack', n: message.n });
          this.run(message.command);
          break;
      }
    });
    ws.on('error', (err: NodeJS.ErrnoException) => {
      failure = err.code ? `${err.code}: ${err.message}` : err.message;
      if (this.stopping || accepted || this.everConnected) return;
      // The first connection failed outright: say why and stop rather than retry forever.
      const why =
        err.code === 'ECONNREFUSED' ? 'connection refused' : err.code === 'ENOTFOUND' ? 'unknown host' : err.message;
      this.end('unreachable', `cannot reach ${this.url}: ${why}`);
    });
    ws.on('close', (code, reasonBuffer) => {
      clearInterval(this.heartbeat);
      if (this.ws === ws) this.epoch = 0;
      if (this.stopping || this.ws !== ws || handled) return;
      const reason = reasonBuffer.toString() || failure || (code === 1006 ? 'closed without a close frame' : '');
      if (code === RUNNER_CLOSE.revoked) return this.end('revoked', reason || 'this runner was deleted');
      if (code === RUNNER_CLOSE.taken || code === RUNNER_CLOSE.replaced) {
        // One token serves one machine: while another process holds it, this one waits.
        return this.scheduleReconnect(code, reason || 'another connection holds this runner token', TAKEN_RETRY_MS);
      }
      if (code === RUNNER_CLOSE.unsupported_protocol || code === RUNNER_CLOSE.protocol_error) {
        return this.end('refused', reason || `closed with ${code}`);
      }
      // Closed before or after a welcome (the service went away, could not record the
      // connection, or the welcome never came): try again, with backoff.
      this.scheduleReconnect(code, reason);
    });
  }

  /** Numbers an event of a sandbox incarnation, keeps it, and sends it soon. */
  emit(sandbox: string, incarnation: number, event: RunnerEvent): void {
    if (this.outputClosed) return;
    const key = `${sandbox}:${incarnation}`;
    try {
      let log = this.outputs.get(key);
      if (!log) {
        log = new OutputLog(sandbox, incarnation, this.outputOptions);
        this.outputs.set(key, log);
      }
      // Stamped now: held while disconnected, or kept over a restart, it keeps its own time.
      log.push(event.at === undefined ? { ...event, at: Date.now() } : event);
    } catch (err) {
      this.report({ type: 'output_lost', sandbox, message: (err as Error).message });
      return;
    }
    if (!this.flushQueued) {
      this.flushQueued = true;
      // Events emitted in one turn of the event loop go out in one frame.
      setImmediate(() => {
        this.flushQueued = false;
        this.flush();
      });
    }
  }

  /** Events kept and not yet durable, over every sandbox (for tests and status). */
  get keptEvents(): number {
    let n = 0;
    for (const log of this.outputs.values()) n += log.kept;
    return n;
  }

  /** Output held in memory over every sandbox (the rest of what is kept is only in the spool). */
  get outputInMemory(): { events: number; bytes: number } {
    const sum = { events: 0, bytes: 0 };
    for (const log of this.outputs.values()) {
      sum.events += log.inMemory.events;
      sum.bytes += log.inMemory.bytes;
    }
    return sum;
  }

  private flush(): void {
    if (this.epoch === 0 || this.ws?.readyState !== WebSocket.OPEN) return;
    for (const log of this.outputs.values()) for (const frame of log.unsent()) this.send(frame);
  }

  private run(command: RunnerCommandBody): void {
    switch (command.kind) {
      case 'sandbox.create': {
        const emit = (e: RunnerEvent) => this.emit(command.sandbox, command.incarnation, e);
        // A new incarnation is a clean machine: runtimes of the one before do not carry over,
        // and a destroy or suspension of it still under way ends first.
        const closed = (this.ending.get(command.sandbox) ?? Promise.resolve()).then(() =>
          this.turns.closeSandbox(command.sandbox),
        );
        const build = closed.then(async () =>
          buildSandbox(
            this.options.root,
            {
              id: command.sandbox,
              incarnation: command.incarnation,
              conversationId: command.conversation_id,
              env: command.env,
              setupScript: command.setup_script,
              network: command.network ?? null,
              repositories: command.repositories,
              packages: command.packages,
              skills: command.skills,
              adopt: command.adopt,
              reach: command.reach,
              broker: command.broker,
            },
            emit,
            { allowApt: this.options.allowApt ?? false, egress: this.egress, isolation: await this.isolation },
          ),
        );
        this.building.set(command.sandbox, build);
        this.incarnations.set(command.sandbox, command.incarnation);
        build.then(
          (sandbox) => {
            this.sandboxes.set(sandbox.id, sandbox);
            this.report({ type: 'sandbox', id: sandbox.id, state: 'ready' });
          },
          (err: Error) => this.report({ type: 'sandbox', id: command.sandbox, state: 'failed', message: err.message }),
        );
        break;
      }
      case 'turn.start': {
        const build = this.building.get(command.sandbox) ?? Promise.reject(new Error('no such sandbox on this runner'));
        void this.turns.start(withLocalRuntimeCommand(command, this.options.runtimeCommands ?? {}), build);
        break;
      }
      case 'turn.interrupt':
        this.turns.interrupt(command.conversation_id, command.turn_id);
        break;
      case 'conversation.close':
        void this.turns.close(command.conversation_id);
        break;
      case 'permission.answer':
        // A request resolved here meanwhile (timeout, turn end) keeps its resolution.
        this.turns.answer(command.conversation_id, command.request_id, command.option_id);
        break;
      case 'sandbox.destroy': {
        if (this.builtSince(command)) break;
        const destroying = this.destroy(command.sandbox);
        this.destroying.add(destroying);
        void destroying.finally(() => this.destroying.delete(destroying));
        break;
      }
      case 'sandbox.suspend': {
        if (this.builtSince(command)) break;
        void this.endSandbox(command.sandbox, async () => {
          this.report({ type: 'sandbox', id: command.sandbox, state: 'suspended' });
        });
        break;
      }
    }
  }

  /** A newer incarnation of the sandbox was built since: it is not the machine the command meant. */
  private builtSince(command: { sandbox: string; incarnation: number }): boolean {
    return (this.incarnations.get(command.sandbox) ?? -1) > command.incarnation;
  }

  /**
   * Stops a sandbox's machine: it is forgotten at once (a turn for it finds no sandbox), its
   * runtimes are stopped once its build settled, its egress grant is revoked, and then `after`
   * runs (removing the directory, for a destroy). The next build of it waits for all of that.
   */
  private endSandbox(id: string, after: () => Promise<void>): Promise<void> {
    const build = this.building.get(id);
    this.sandboxes.delete(id);
    this.building.delete(id);
    this.incarnations.delete(id);
    const ending = (this.ending.get(id) ?? Promise.resolve())
      .then(async () => {
        await build?.catch(() => {});
        await this.turns.closeSandbox(id);
        await this.egress.forget(id);
        await after();
      })
      .catch((err: Error) => this.report({ type: 'sandbox', id, state: 'failed', message: err.message }))
      .finally(() => {
        if (this.ending.get(id) === ending) this.ending.delete(id);
      });
    this.ending.set(id, ending);
    return ending;
  }

  /** Ends a sandbox's machine and removes its directory, so a later build of it starts from nothing. */
  private destroy(id: string): Promise<void> {
    return this.endSandbox(id, () => this.removeDisk(id));
  }

  private async removeDisk(id: string): Promise<void> {
    try {
      await rm(sandboxDir(this.options.root, id), { recursive: true, force: true });
      this.report({ type: 'sandbox', id, state: 'destroyed' });
    } catch (err) {
      this.report({ type: 'sandbox', id, state: 'failed', message: `not removed: ${(err as Error).message}` });
    }
  }

  /**
   * A request of a sandbox's process that the egress proxy refused: one `stderr` line in its
   * conversation per refused host and turn (the build's, for the setup script), so a refusal is
   * visible without a retrying client flooding the log.
   */
  private refused(grant: EgressGrant, host: string, reason = 'not in allowed_hosts'): void {
    const turnId = this.turns.runningTurn(grant.conversationId);
    const key = `${grant.conversationId} ${turnId} ${host}`;
    if (this.refusals.has(key)) return;
    if (this.refusals.size >= 10_000) this.refusals.clear();
    this.refusals.add(key);
    this.emit(grant.sandbox, grant.incarnation, {
      conversation_id: grant.conversationId,
      turn_id: turnId,
      kind: 'output',
      stream: 'stderr',
      data: `svc-runner: network: refused ${host} (${reason})\n`,
    });
  }

  /**
   * Egress log rows waiting to be sent: a short batch, or all those of a time disconnected
   * (up to EGRESS_ROWS_HELD), which go once the service welcomes the runner again.
   */
  private egressRows: RunnerEgressRow[] = [];
  private egressTimer: NodeJS.Timeout | undefined;
  private egressDropped = 0;

  /** A row of a brokered sandbox's egress log, sent to the service within 100 ms of a welcome. */
  private egressRow(conversationId: string, row: Omit<RunnerEgressRow, 'conversation_id'>): void {
    if (this.egressRows.length >= EGRESS_ROWS_HELD) {
      this.egressDropped++;
      return;
    }
    this.egressRows.push({ conversation_id: conversationId, ...row });
    this.sendEgressSoon();
  }

  /** Sends the waiting egress rows in 100 ms, when connected and welcomed (epoch set). */
  private sendEgressSoon(): void {
    if (this.epoch === 0 || this.egressRows.length === 0) return;
    this.egressTimer ??= setTimeout(() => {
      this.egressTimer = undefined;
      if (this.epoch === 0) return;
      const rows = this.egressRows.splice(0, EGRESS_ROWS_HELD);
      for (let i = 0; i < rows.length; i += 1000) this.send({ t: 'egress', rows: rows.slice(i, i + 1000) });
      if (this.egressDropped > 0) {
        this.report({ type: 'egress_dropped', rows: this.egressDropped });
        this.egressDropped = 0;
      }
    }, 100);
  }

  /** Reconnects after a backoff that grows with the attempts, or after about `fixedMs`. */
  private scheduleReconnect(code: number, reason: string, fixedMs?: number): void {
    if (this.stopping) return;
    const { first, max } = this.options.backoffMs ?? { first: 500, max: 30_000 };
    // Full jitter: a fleet of runners cut off at once does not come back at once.
    const ceiling = Math.min(max, first * 2 ** Math.min(this.attempt, 16));
    const delay = Math.round(
      fixedMs !== undefined ? fixedMs * (0.75 + Math.random() / 2) : first / 2 + Math.random() * ceiling,
    );
    this.report({ type: 'disconnected', code, reason, retryInMs: delay });
    this.retry = setTimeout(() => this.connect(), delay);
  }
}
