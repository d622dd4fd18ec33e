import {
  ApiError,
  decodeFrame,
  encodeFrame,
  opensAutonomousTurn,
  PERMISSION_REQUEST_STAGE,
  RUNNER_CLOSE,
  RUNNER_PROTOCOL_VERSION,
  type RunnerCommandBody,
  type RunnerEvent,
  RunnerMessage,
  type RunnerOutput,
  type ServiceMessage,
  sandboxProducer,
  type TurnError,
  turnErrorOf,
} from '@svc/core';
import { conversations, egressLog, logEvents, runners, type Sql, sandboxes } from '@svc/db';
import type { Logger } from 'pino';
import type { AppendEvents } from '../log/log.append.ts';
import type { AppendResult, NewEvent } from '../log/log.ts';
import { hashSecret } from '../secrets/tokens.ts';
import { recordConnected, recordDisconnected } from '../services/runners.ts';
import type { RunnerRouter, RunnerSelector } from './router.ts';

type TurnResult = 'done' | 'failed' | 'interrupted' | 'timeout';

/**
 * What an event of a deleted conversation becomes: no conversation, no content, a kind no
 * stream sends. It holds the event's number, so the runner's output stays numbered without
 * holes and the runner forgets it like any other.
 */
const DROPPED = {
  conversationId: null,
  turnId: null,
  kind: 'dropped',
  stream: 'stdout',
  data: null,
  stage: null,
  state: null,
  durationMs: null,
} as const;
const TURN_RESULTS = new Set<string>(['done', 'failed', 'interrupted', 'timeout']);
type Usage = { input: number; output: number; cache_read?: number; cache_write?: number };

/** The usage a turn's end event carries (`{"usage": {...}}`), or null. */
function usageOf(data: string | null): Usage | null {
  if (!data) return null;
  try {
    const u = (JSON.parse(data) as { usage?: Usage | null }).usage;
    return u && Number.isFinite(u.input) && Number.isFinite(u.output) ? u : null;
  } catch {
    return null;
  }
}

/** What a transport gives the fabric for one accepted connection. */
export interface RunnerConnection {
  send(frame: Uint8Array): void;
  close(code: number, reason: string): void;
}

/** What the transport tells the fabric about that connection. */
export interface RunnerSession {
  message(frame: Uint8Array): void;
  closed(): void;
}

export interface FabricOptions {
  /** How often runners send a heartbeat (told to them in the welcome). */
  heartbeatMs: number;
  /** A connection that sent no hello, or no heartbeat, for this long is closed. */
  silenceMs: number;
  /** A command not acknowledged within this long answers `runner_offline`. */
  commandTimeoutMs: number;
  /**
   * Output a connection may have waiting to be appended, in bytes as received. A runner keeps
   * what is not acknowledged (8 MiB per sandbox by default) and resends it after a reconnect,
   * so past this bound the connection is closed with `going_away`: nothing is lost, and a
   * runner that ignores acknowledgements cannot fill this node's memory.
   */
  maxQueuedBytes: number;
}

/** What a session knows of a sandbox it speaks for (loaded once, from its row). */
interface SandboxSeen {
  accountId: string;
  incarnation: number;
  conversations: Set<string>;
}

interface Live {
  runnerId: string;
  accountId: string;
  conn: RunnerConnection;
  /** Set once the hello is recorded. */
  epoch: number;
  instance: string;
  /** A tenant's own runner, or a `local` provider's runner-agent. */
  kind: 'self' | 'local';
  /** What its hello says it takes beyond protocol 1's first commands. */
  capabilities: readonly string[];
  openedAt: number;
  lastHeardAt: number;
  closed: boolean;
  /**
   * Output frames received and not yet appended, oldest first. One drain at a time appends
   * them in the order they arrived; consecutive frames of one sandbox are appended together.
   */
  outbox: RunnerOutput[];
  /** The received size of each queued frame, and their sum (FabricOptions.maxQueuedBytes). */
  outboxSizes: number[];
  queuedBytes: number;
  draining: boolean;
  sandboxes: Map<string, SandboxSeen>;
  /** Commands sent and not yet acknowledged, by number. */
  pending: Map<number, { resolve(): void; reject(err: Error): void; timer: NodeJS.Timeout }>;
  nextCommand: number;
}

/** Bounds of an append made of merged frames (a frame alone may be larger: it goes alone). */
const MERGED_EVENTS_MAX = 1000;
const MERGED_CHARS_MAX = 1024 * 1024;

const charsOf = (m: RunnerOutput) => m.events.reduce((n, e) => n + (e.data?.length ?? 0), 0);

/**
 * The oldest queued frame, with the frames right behind it that continue its numbering (same
 * sandbox incarnation, next seq) merged in, within the bounds above; taken off the queue.
 */
export function takeMerged(outbox: RunnerOutput[]): RunnerOutput {
  const first = outbox.shift() as RunnerOutput;
  let merged: RunnerOutput | undefined;
  let chars = 0;
  for (let next = outbox[0]; next; next = outbox[0]) {
    const m = merged ?? first;
    if (next.sandbox !== m.sandbox || next.incarnation !== m.incarnation) break;
    if (next.seq !== m.seq + m.events.length || m.events.length + next.events.length > MERGED_EVENTS_MAX) break;
    if (!merged) chars = charsOf(first);
    chars += charsOf(next);
    if (chars > MERGED_CHARS_MAX) break;
    merged ??= { ...first, events: [...first.events] };
    merged.events.push(...next.events);
    outbox.shift();
  }
  return merged ?? first;
}

/**
 * The runner fabric's session logic, whatever the transport (the edge's uWebSockets.js, or
 * @fastify/websocket when the api role runs alone): authenticate the runner's token at the
 * upgrade, take its hello, record the connection with a new epoch, keep presence from
 * heartbeats, and hold one live connection per runner (a newer one replaces the older,
 * which is closed with `replaced`). One interval checks every connection for silence.
 */
export class RunnerFabric {
  /** Live connections on this node, by runner id. */
  private readonly live = new Map<string, Live>();
  /** Runners whose connection ended here, with when and which epoch, until they return or the grace ends. */
  private readonly gone = new Map<string, { since: number; epoch: number }>();
  /** The connection that last spoke for each sandbox (to tell it what became durable). */
  private readonly bySandbox = new Map<string, Live>();
  private readonly sessions = new Set<Live>();
  private readonly timer: NodeJS.Timeout;

  private router: RunnerRouter | undefined;
  /** Told when an account's connections are closed on this node (onAccountClosed). */
  private readonly accountClosed: ((accountId: string) => void)[] = [];

  constructor(
    private readonly deps: {
      sql: Sql;
      logger: Logger;
      appendEvents: AppendEvents;
      /** A runner stayed away longer than the grace: its running turns fail, visibly. */
      onRunnerGone: (runnerId: string) => Promise<unknown>;
      /** A runner connected holding these sandboxes: their running conversations are reattached. */
      onReattach?: (runnerId: string, sandboxIds: string[]) => Promise<unknown>;
      /**
       * A turn's end arrived from its runner: record the result (once), with why it failed
       * (`error`, from the end's data; null when it names none).
       */
      onTurnEnd: (
        tenant: string,
        turnId: string,
        result: TurnResult,
        usage: Usage | null,
        error: TurnError | null,
      ) => Promise<unknown>;
      /** A sandbox build ended on its runner (stage `sandbox` done or failed): record it (once). */
      onSandboxBuilt: (sandboxId: string, incarnation: number, ok: boolean) => Promise<unknown>;
      /**
       * A permission request's `request` stage event (started or done), before it is appended,
       * so the request is on record before its block reaches a client. Called again for a
       * resend: it must be idempotent.
       */
      onPermissionStage: (tenant: string, event: RunnerEvent) => Promise<unknown>;
      /**
       * A runner opened an autonomous turn (`opensAutonomousTurn`): record it, before its
       * events are appended, so its output reaches clients under a turn on record. Called
       * again for a resend: it must be idempotent.
       */
      onAutonomousTurn?: (tenant: string, conversationId: string, turnId: string) => Promise<unknown>;
    },
    readonly options: FabricOptions,
  ) {
    this.timer = setInterval(() => this.sweep(), Math.max(50, Math.floor(options.heartbeatMs / 2)));
    this.timer.unref();
  }

  /** Runners connected to this node (their hello was taken). */
  get connectedRunners(): number {
    return this.live.size;
  }

  /** The runner a bearer token belongs to, or undefined (the transport answers 401). */
  async authenticate(authorization: string | undefined): Promise<runners.RunnerRow | undefined> {
    const m = /^Bearer\s+(svcr_\S+)\s*$/i.exec(authorization ?? '');
    if (!m?.[1]) return undefined;
    return runners.findByTokenHash(this.deps.sql, hashSecret(m[1]));
  }

  /** A connection was upgraded for `runner`; the transport feeds the returned session. */
  attach(runner: runners.RunnerRow, conn: RunnerConnection): RunnerSession {
    const now = Date.now();
    const s: Live = {
      runnerId: runner.id,
      accountId: runner.account_id,
      conn,
      epoch: 0,
      instance: '',
      kind: runner.kind,
      capabilities: [],
      openedAt: now,
      lastHeardAt: now,
      closed: false,
      outbox: [],
      outboxSizes: [],
      queuedBytes: 0,
      draining: false,
      sandboxes: new Map(),
      pending: new Map(),
      nextCommand: 0,
    };
    this.sessions.add(s);
    let helloSeen = false;
    return {
      message: (frame) => {
        if (s.closed) return;
        const message = decodeFrame(RunnerMessage, frame);
        if (!message) return this.close(s, RUNNER_CLOSE.protocol_error, 'not a message of the runner protocol');
        s.lastHeardAt = Date.now();
        if (message.t === 'hello') {
          if (helloSeen) return this.close(s, RUNNER_CLOSE.protocol_error, 'a second hello');
          helloSeen = true;
          this.hello(s, message).catch((err: Error) => {
            this.deps.logger.error({ err: { message: err.message }, runner: s.runnerId }, 'runner hello failed');
            this.close(s, RUNNER_CLOSE.going_away, 'the service could not record the connection; try again');
          });
          return;
        }
        if (!helloSeen) return this.close(s, RUNNER_CLOSE.protocol_error, 'the first message must be a hello');
        if (message.t === 'output') {
          s.queuedBytes += frame.byteLength;
          if (s.queuedBytes > this.options.maxQueuedBytes) {
            this.deps.logger.warn(
              { runner: s.runnerId, queued: s.queuedBytes, frames: s.outbox.length },
              'runner output arrives faster than it is appended; connection closed',
            );
            return this.close(
              s,
              RUNNER_CLOSE.going_away,
              `more than ${this.options.maxQueuedBytes} bytes of output waiting to be appended; reconnect and resend what is not acknowledged`,
            );
          }
          s.outbox.push(message);
          s.outboxSizes.push(frame.byteLength);
          if (!s.draining) void this.drain(s);
          return;
        }
        if (message.t === 'egress') {
          if (s.epoch > 0) void this.egress(s, message.rows);
          return;
        }
        if (message.t === 'ack') {
          const p = s.pending.get(message.n);
          if (p) {
            s.pending.delete(message.n);
            clearTimeout(p.timer);
            p.resolve();
          }
          return;
        }
        if (message.t === 'heartbeat' && s.epoch > 0) {
          runners
            .seen(this.deps.sql, s.runnerId, s.epoch)
            .then((current) => {
              // Deleted, or replaced through another node: this connection is over.
              if (current === undefined) this.close(s, RUNNER_CLOSE.revoked, 'this runner was deleted by its owner');
              else if (current.epoch !== s.epoch) {
                this.close(s, RUNNER_CLOSE.replaced, 'another connection with this runner token took over');
              } else if (!current.connected) {
                // Recorded gone by a presence sweep while this node still holds it: the runner connects
                // again, so the row and its owner's watchers learn it is back.
                this.close(s, RUNNER_CLOSE.going_away, 'no heartbeat in time; reconnect');
              } else if (!s.closed) this.router?.hold(s.runnerId);
            })
            .catch((err: Error) => this.deps.logger.warn({ err: { message: err.message } }, 'runner heartbeat'));
        }
      },
      closed: () => this.closed(s),
    };
  }

  /**
   * A runner's egress log rows (its broker's requests and refusals): stored for the conversations
   * of the runner's own account only; a row naming another's is dropped.
   */
  private async egress(s: Live, rows: Extract<RunnerMessage, { t: 'egress' }>['rows']): Promise<void> {
    try {
      const owned = new Map<string, boolean>();
      for (const id of new Set(rows.map((r) => r.conversation_id))) {
        owned.set(id, await conversations.exists(this.deps.sql, s.accountId, id));
      }
      await egressLog.insertEgressRows(
        this.deps.sql,
        rows
          .filter((r) => owned.get(r.conversation_id))
          .map((r) => ({
            accountId: s.accountId,
            conversationId: r.conversation_id,
            at: new Date(r.at),
            host: r.host,
            port: r.port,
            method: r.method,
            bindingId: r.binding_id,
            status: r.status,
            latencyMs: r.latency_ms,
            refused: r.refused,
            reason: r.reason,
          })),
      );
    } catch (err) {
      this.deps.logger.warn(
        { err: { message: (err as Error).message }, runner: s.runnerId },
        'egress log rows not stored',
      );
    }
  }

  private async hello(s: Live, hello: Extract<RunnerMessage, { t: 'hello' }>): Promise<void> {
    if (hello.protocol !== RUNNER_PROTOCOL_VERSION) {
      return this.close(
        s,
        RUNNER_CLOSE.unsupported_protocol,
        `protocol ${hello.protocol} is not spoken here (this service speaks ${RUNNER_PROTOCOL_VERSION})`,
      );
    }
    s.instance = hello.instance;
    s.capabilities = hello.capabilities;
    // The sandboxes recorded on it that it no longer holds are settled in the same transaction
    // (woken later from their kept directories, or failed): once the connection is recorded,
    // commands come, and none may find a sandbox the runner does not have.
    const recorded = await recordConnected(
      this.deps.sql,
      s.runnerId,
      { hostname: hello.hostname, path: hello.root, version: hello.version, instance: hello.instance },
      this.options.silenceMs,
      { held: hello.sandboxes.map((h) => h.id), kept: hello.kept ?? [] },
    );
    if (typeof recorded === 'object') {
      // The token serves one machine: the process connected keeps it; this one waits.
      return this.close(
        s,
        RUNNER_CLOSE.taken,
        `another svc-runner${recorded.taken.hostname ? ` on ${recorded.taken.hostname}` : ''} is connected with this runner token`,
      );
    }
    const epoch = recorded;
    if (s.closed) {
      if (epoch !== undefined) await recordDisconnected(this.deps.sql, s.runnerId, epoch);
      return;
    }
    if (epoch === undefined) return this.close(s, RUNNER_CLOSE.revoked, 'this runner was deleted by its owner');
    s.epoch = epoch;
    const previous = this.live.get(s.runnerId);
    this.live.set(s.runnerId, s);
    if (previous && previous !== s) {
      // The same process's older connection, or another's that went silent past the grace.
      if (previous.instance !== s.instance) {
        this.deps.logger.warn(
          { runner: s.runnerId, old: previous.instance, new: s.instance },
          'a runner token’s silent connection was taken over by another process',
        );
      }
      this.close(previous, RUNNER_CLOSE.replaced, 'another connection with this runner token took over');
    }
    this.router?.hold(s.runnerId);
    // Recorded before the welcome, after which the runner resends what it held: a turn it
    // finished while away would otherwise end before it is found running, and its
    // conversation would never say it was reattached.
    if (hello.sandboxes.length && this.deps.onReattach) {
      await this.deps
        .onReattach(
          s.runnerId,
          hello.sandboxes.map((h) => h.id),
        )
        .catch((err: Error) =>
          this.deps.logger.warn({ err: { message: err.message }, runner: s.runnerId }, 'reattach not recorded'),
        );
      if (s.closed) return;
    }
    this.send(s, { t: 'welcome', runner_id: s.runnerId, epoch, heartbeat_ms: this.options.heartbeatMs });
    this.deps.logger.info({ runner: s.runnerId, epoch, hostname: hello.hostname }, 'runner connected');
    // A local runner-agent's root is its account's, shared with the others: its provider
    // removes what it keeps.
    if (hello.kept?.length && s.kind === 'self') void this.destroyOrphans(s, hello.kept);
  }

  /**
   * The directories a tenant's runner keeps of sandboxes that are gone (terminated or deleted
   * while it was away, or failed) are removed: it is told `sandbox.destroy` for each, naming
   * the incarnation the service knows (a build of a newer one started meanwhile is left alone
   * by the runner).
   */
  private async destroyOrphans(s: Live, kept: string[]): Promise<void> {
    try {
      for (const orphan of await sandboxes.orphanedOnRunner(this.deps.sql, s.accountId, kept)) {
        if (s.closed) return;
        await this.commandHere(s.runnerId, {
          kind: 'sandbox.destroy',
          sandbox: orphan.id,
          incarnation: orphan.incarnation,
        });
      }
    } catch (err) {
      this.deps.logger.warn(
        { err: { message: (err as Error).message }, runner: s.runnerId },
        'kept directories of gone sandboxes not removed; the next connection tries again',
      );
    }
  }

  /**
   * Appends the connection's queued output, in order, until none is left. The frames that
   * queued behind an append go as one (a group commit): under load a runner's window of frames
   * costs one append and one `appended` instead of one each.
   */
  private async drain(s: Live): Promise<void> {
    s.draining = true;
    try {
      while (!s.closed && s.outbox.length > 0) {
        const queued = s.outbox.length;
        const m = takeMerged(s.outbox);
        for (let taken = queued - s.outbox.length; taken > 0; taken--) s.queuedBytes -= s.outboxSizes.shift() ?? 0;
        try {
          await this.output(s, m);
        } catch (err) {
          if (err instanceof ApiError) return this.close(s, RUNNER_CLOSE.protocol_error, err.message);
          // The log refused it for now (Redis away): the runner resends after reconnecting.
          this.deps.logger.error(
            { err: { message: (err as Error).message }, runner: s.runnerId },
            'runner output not appended',
          );
          return this.close(s, RUNNER_CLOSE.going_away, 'output could not be appended; reconnect and resend');
        }
      }
    } finally {
      s.draining = false;
      if (s.closed) {
        s.outbox.length = 0;
        s.outboxSizes.length = 0;
        s.queuedBytes = 0;
      }
    }
  }

  /**
   * Appends a sandbox's output through the single write path, as the producer of its
   * incarnation, and tells the runner how far the log holds it (and, for a resend, how far
   * the copy does). A runner speaks only for its own sandboxes and their conversations.
   */
  private async output(s: Live, m: RunnerOutput): Promise<void> {
    if (s.closed) return;
    let sbx = await this.sandboxFor(s, m.sandbox);
    // A newer incarnation than the one loaded: the machine was reset since; look again once.
    if (sbx && m.incarnation > sbx.incarnation) sbx = await this.sandboxFor(s, m.sandbox, true);
    if (!sbx || m.incarnation > sbx.incarnation) {
      // Not a runner misbehaving but one holding output of a sandbox that is gone (deleted
      // with its account, say): it forgets it, rather than resending it at every start.
      this.deps.logger.warn(
        { runner: s.runnerId, sandbox: m.sandbox, incarnation: m.incarnation, events: m.events.length },
        'output of a sandbox not on this runner: told to discard it',
      );
      this.send(s, {
        t: 'discard',
        sandbox: m.sandbox,
        incarnation: m.incarnation,
        reason: `sandbox ${m.sandbox} (incarnation ${m.incarnation}) is not on this runner`,
      });
      return;
    }
    // Conversations deleted while their runtime still spoke: their events are not kept.
    let deleted: Set<string> | undefined;
    for (const e of m.events) {
      if (!sbx.conversations.has(e.conversation_id) && !deleted?.has(e.conversation_id)) {
        // A conversation attached since the sandbox was loaded: look again once.
        const fresh = await sandboxes.conversationIds(this.deps.sql, sbx.accountId, m.sandbox);
        sbx.conversations = new Set(fresh);
        if (!sbx.conversations.has(e.conversation_id)) {
          if (await conversations.exists(this.deps.sql, sbx.accountId, e.conversation_id)) {
            throw new ApiError('invalid_request', `conversation ${e.conversation_id} is not on sandbox ${m.sandbox}`);
          }
          deleted ??= new Set();
          deleted.add(e.conversation_id);
        }
      }
    }
    for (const e of m.events) {
      if (deleted?.has(e.conversation_id)) continue;
      if (e.kind === 'stage' && e.stage === PERMISSION_REQUEST_STAGE)
        await this.deps.onPermissionStage(sbx.accountId, e);
      if (e.turn_id && opensAutonomousTurn(e))
        await this.deps.onAutonomousTurn?.(sbx.accountId, e.conversation_id, e.turn_id);
    }
    const producer = sandboxProducer(m.sandbox, m.incarnation);
    this.bySandbox.set(m.sandbox, s);
    const events: NewEvent[] = m.events.map((e) =>
      deleted?.has(e.conversation_id)
        ? // Its place in the producer's numbering is kept, with nothing of what it said.
          DROPPED
        : {
            conversationId: e.conversation_id,
            turnId: e.turn_id ?? null,
            kind: e.kind,
            stream: e.stream,
            data: e.data ?? null,
            stage: e.stage ?? null,
            state: e.state ?? null,
            durationMs: e.duration_ms ?? null,
            ...eventTime(e.at),
          },
    );
    const tenant = sbx.accountId;
    // Appended in segments that end before each turn's end event, whose record is ended first
    // (compare-and-set: once): a client that sees `turn done` finds the conversation idle and
    // can send the next prompt at once. A resend ends a record its first sending did not. The
    // end of a build (the runner closes stage `sandbox`), or of a suspended sandbox's wake
    // (stage `reattach`: only a runner adopting a kept directory sends it), makes the sandbox
    // ready or failed the same way, before a client can see it.
    const result = { status: 'appended' as AppendResult['status'], hwm: 0 };
    let from = 0;
    const appendUpTo = async (to: number): Promise<boolean> => {
      if (to <= from) return true;
      const r = await this.deps.appendEvents({ tenant, producer, seq: m.seq + from, events: events.slice(from, to) });
      result.hwm = r.hwm;
      if (r.status !== 'appended') result.status = r.status;
      if (r.status === 'gap') return false;
      from = to;
      return true;
    };
    let whole = true;
    for (const [i, e] of events.entries()) {
      if (e.kind !== 'stage') continue;
      const turnEnd = e.stage === 'turn' && e.turnId && TURN_RESULTS.has(e.state ?? '');
      const buildEnd =
        (e.stage === 'sandbox' || e.stage === 'reattach') && (e.state === 'done' || e.state === 'failed');
      if (!turnEnd && !buildEnd) continue;
      whole = await appendUpTo(i);
      if (!whole) break;
      if (buildEnd) {
        await this.deps.onSandboxBuilt(m.sandbox, m.incarnation, e.state === 'done');
        continue;
      }
      const data = e.data ?? null;
      await this.deps.onTurnEnd(
        tenant,
        e.turnId as string,
        e.state as TurnResult,
        usageOf(data),
        turnErrorOf(data) ?? null,
      );
    }
    if (whole) await appendUpTo(events.length);
    this.send(s, { t: 'appended', sandbox: m.sandbox, incarnation: m.incarnation, hwm: result.hwm });
    if (result.status === 'duplicate') {
      // A resend after a reconnect: what the copy holds may be forgotten now.
      const durable = await logEvents.durableMark(this.deps.sql, sbx.accountId, producer);
      if (durable !== undefined)
        this.send(s, { t: 'durable', sandbox: m.sandbox, incarnation: m.incarnation, seq: durable });
    }
  }

  private async sandboxFor(s: Live, id: string, reload = false): Promise<SandboxSeen | undefined> {
    const known = s.sandboxes.get(id);
    if (known && !reload) return known;
    const row = await sandboxes.onRunner(this.deps.sql, s.runnerId, id);
    if (!row) return undefined;
    const seen: SandboxSeen = {
      accountId: row.account_id,
      incarnation: row.incarnation,
      conversations: new Set(await sandboxes.conversationIds(this.deps.sql, row.account_id, id)),
    };
    s.sandboxes.set(id, seen);
    return seen;
  }

  /**
   * The copy committed output up to these marks (LogCopier.onDurable): each sandbox producer's
   * runner, when connected here, may forget it.
   */
  durable(marks: ReadonlyMap<string, number>): void {
    for (const [producer, seq] of marks) {
      const m = /^sbx:(.+):(\d+)$/.exec(producer);
      if (!m?.[1]) continue;
      const s = this.bySandbox.get(m[1]);
      if (s && !s.closed) this.send(s, { t: 'durable', sandbox: m[1], incarnation: Number(m[2]), seq });
    }
  }

  /**
   * Routes commands to runners held by other nodes and durable marks to them (several nodes
   * on one Redis). Without one, a runner this node does not hold is offline.
   */
  setRouter(router: RunnerRouter): void {
    this.router = router;
  }

  /**
   * Sends a command to the runner, through the node holding its connection when that is not
   * this one, and resolves once it is acknowledged. 503 `runner_offline` when no node holds
   * the runner or it does not acknowledge in time.
   */
  command(runnerId: string, body: RunnerCommandBody): Promise<void> {
    if (!this.live.has(runnerId) && this.router) return this.router.forward(runnerId, body);
    return this.commandHere(runnerId, body);
  }

  /** `command` for a runner whose connection this node holds (the router's entry point). */
  commandHere(runnerId: string, body: RunnerCommandBody): Promise<void> {
    const s = this.live.get(runnerId);
    if (!s || s.closed || s.epoch === 0) return Promise.reject(new ApiError('runner_offline'));
    const n = ++s.nextCommand;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        s.pending.delete(n);
        reject(new ApiError('runner_offline', 'The runner did not acknowledge the command in time.'));
      }, this.options.commandTimeoutMs);
      timer.unref();
      s.pending.set(n, { resolve, reject, timer });
      this.send(s, { t: 'command', n, epoch: s.epoch, command: body });
    });
  }

  private send(s: Live, message: ServiceMessage): void {
    if (!s.closed) s.conn.send(encodeFrame(message));
  }

  private close(s: Live, code: number, reason: string): void {
    if (s.closed) return;
    s.conn.close(code, reason);
    this.closed(s);
  }

  private closed(s: Live): void {
    if (s.closed) return;
    s.closed = true;
    this.sessions.delete(s);
    if (this.live.get(s.runnerId) === s) {
      this.live.delete(s.runnerId);
      this.router?.release(s.runnerId);
    }
    for (const [id, holder] of this.bySandbox) if (holder === s) this.bySandbox.delete(id);
    if (s.epoch > 0 && !this.live.has(s.runnerId)) this.gone.set(s.runnerId, { since: Date.now(), epoch: s.epoch });
    for (const p of s.pending.values()) {
      clearTimeout(p.timer);
      p.reject(new ApiError('runner_offline', 'The runner disconnected before acknowledging the command.'));
    }
    s.pending.clear();
    if (s.epoch > 0) {
      recordDisconnected(this.deps.sql, s.runnerId, s.epoch).catch((err: Error) => {
        this.deps.logger.warn({ err: { message: err.message }, runner: s.runnerId }, 'runner disconnect not recorded');
      });
    }
  }

  /**
   * Closes the connections `who` selects wherever they are (the runner or its account was
   * deleted, or the account suspended): this node's at once, and through the router every
   * other node's with the same code and reason. Resolves once the other nodes have been asked;
   * a node that misses the request closes them at their next heartbeat, which finds the runner
   * gone. An account selector also reaches every node's onAccountClosed listeners.
   */
  async disconnectEverywhere(who: RunnerSelector, code: number, reason: string): Promise<void> {
    this.disconnectHere(who, code, reason);
    await this.router?.disconnect(who, code, reason);
  }

  /**
   * `listener` is called on this node whenever an account's connections are closed here, by
   * this node's disconnectEverywhere or another node's through the router: the other live
   * connections of the account on this node (its SSE streams) end with its runners'.
   */
  onAccountClosed(listener: (accountId: string) => void): void {
    this.accountClosed.push(listener);
  }

  /**
   * `disconnectEverywhere` on this node only (the router's entry point): closes every
   * connection here that `who` selects, also one still waiting for its hello, and tells the
   * onAccountClosed listeners of an account selector. Returns how many runner connections
   * it closed.
   */
  disconnectHere(who: RunnerSelector, code: number, reason: string): number {
    if ('accountId' in who) {
      for (const listener of this.accountClosed) listener(who.accountId);
    }
    let closed = 0;
    for (const s of [...this.sessions]) {
      const selected = 'runnerId' in who ? s.runnerId === who.runnerId : s.accountId === who.accountId;
      if (!selected || s.closed) continue;
      this.close(s, code, reason);
      closed++;
    }
    return closed;
  }

  /** Whether the runner holds a live connection on this node. */
  isLive(runnerId: string): boolean {
    return this.live.has(runnerId);
  }

  /** The runners connected to this node (welcomed) whose hello names `capability`. */
  liveWith(capability: string): string[] {
    const out: string[] = [];
    for (const s of this.live.values()) if (s.epoch > 0 && s.capabilities.includes(capability)) out.push(s.runnerId);
    return out;
  }

  private sweep(): void {
    const now = Date.now();
    for (const [runnerId, g] of this.gone) {
      if (this.live.has(runnerId)) {
        this.gone.delete(runnerId);
        continue;
      }
      if (now - g.since < this.options.silenceMs) continue;
      this.gone.delete(runnerId);
      // Back through another node? Then its turns go on there.
      runners
        .reconnectedSince(this.deps.sql, runnerId, g.epoch)
        .then((back) => (back ? undefined : this.deps.onRunnerGone(runnerId)))
        .catch((err: Error) =>
          this.deps.logger.error({ err: { message: err.message }, runner: runnerId }, 'runner gone'),
        );
    }
    for (const s of this.sessions) {
      if (now - s.lastHeardAt < this.options.silenceMs) continue;
      if (s.epoch === 0) this.close(s, RUNNER_CLOSE.hello_timeout, 'no hello in time');
      else this.close(s, RUNNER_CLOSE.going_away, 'no heartbeat in time; reconnect');
    }
  }

  /** Closes every connection (`going_away`: runners reconnect, to another node if there is one). */
  shutdown(): void {
    clearInterval(this.timer);
    for (const s of [...this.sessions]) this.close(s, RUNNER_CLOSE.going_away, 'the service is shutting down');
  }
}

/** How far back a runner's own time for an event is taken (a runner away for longer says "now"). */
const EVENT_TIME_MAX_AGE_MS = 7 * 24 * 60 * 60 * 1000;

/**
 * A runner event's own time as the log stores it: never later than now (a runner's clock
 * ahead of ours), and absent (the append time then) when the runner gave none or one older
 * than a week.
 */
function eventTime(at: number | undefined): { at?: string } {
  if (at === undefined) return {};
  const now = Date.now();
  if (at < now - EVENT_TIME_MAX_AGE_MS) return {};
  return { at: new Date(Math.min(at, now)).toISOString() };
}
