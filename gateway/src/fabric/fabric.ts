import {
  decodeFrame,
  encodeFrame,
  RUNNER_CLOSE,
  RUNNER_PROTOCOL_VERSION,
  RunnerMessage,
  type ServiceMessage,
} from '@svc/core';
import { runners, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import { hashSecret } from '../secrets/tokens.ts';

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
}

interface Live {
  runnerId: string;
  accountId: string;
  conn: RunnerConnection;
  /** Set once the hello is recorded. */
  epoch: number;
  instance: string;
  openedAt: number;
  lastHeardAt: number;
  closed: boolean;
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
  private readonly sessions = new Set<Live>();
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly deps: { sql: Sql; logger: Logger },
    readonly options: FabricOptions,
  ) {
    this.timer = setInterval(() => this.sweep(), Math.max(50, Math.floor(options.heartbeatMs / 2)));
    this.timer.unref();
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
      openedAt: now,
      lastHeardAt: now,
      closed: false,
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
        if (message.t === 'heartbeat' && s.epoch > 0) {
          runners
            .seen(this.deps.sql, s.runnerId, s.epoch)
            .then((current) => {
              // Deleted, or replaced through another node: this connection is over.
              if (current === undefined) this.close(s, RUNNER_CLOSE.revoked, 'this runner was deleted by its owner');
              else if (current !== s.epoch) {
                this.close(s, RUNNER_CLOSE.replaced, 'another connection with this runner token took over');
              }
            })
            .catch((err: Error) => this.deps.logger.warn({ err: { message: err.message } }, 'runner heartbeat'));
        }
      },
      closed: () => this.closed(s),
    };
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
    const epoch = await runners.connected(this.deps.sql, s.runnerId, {
      hostname: hello.hostname,
      path: hello.root,
      version: hello.version,
      instance: hello.instance,
    });
    if (s.closed) {
      if (epoch !== undefined) await runners.disconnected(this.deps.sql, s.runnerId, epoch);
      return;
    }
    if (epoch === undefined) return this.close(s, RUNNER_CLOSE.revoked, 'this runner was deleted by its owner');
    s.epoch = epoch;
    const previous = this.live.get(s.runnerId);
    this.live.set(s.runnerId, s);
    if (previous && previous !== s) {
      if (previous.instance !== s.instance) {
        // Two processes with one token would take turns forever; the older one is told to stop.
        this.deps.logger.warn(
          { runner: s.runnerId, old: previous.instance, new: s.instance },
          'two runner-agent processes use one runner token; the older connection is closed',
        );
      }
      this.close(previous, RUNNER_CLOSE.replaced, 'another connection with this runner token took over');
    }
    this.send(s, { t: 'welcome', runner_id: s.runnerId, epoch, heartbeat_ms: this.options.heartbeatMs });
    this.deps.logger.info({ runner: s.runnerId, epoch, hostname: hello.hostname }, 'runner connected');
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
    if (this.live.get(s.runnerId) === s) this.live.delete(s.runnerId);
    if (s.epoch > 0) {
      runners.disconnected(this.deps.sql, s.runnerId, s.epoch).catch((err: Error) => {
        this.deps.logger.warn({ err: { message: err.message }, runner: s.runnerId }, 'runner disconnect not recorded');
      });
    }
  }

  /** Closes the runner's live connection on this node, if any (its owner deleted it). */
  disconnect(runnerId: string, code: number, reason: string): boolean {
    const s = this.live.get(runnerId);
    if (!s) return false;
    this.close(s, code, reason);
    return true;
  }

  /** Whether the runner holds a live connection on this node. */
  isLive(runnerId: string): boolean {
    return this.live.has(runnerId);
  }

  private sweep(): void {
    const now = Date.now();
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
