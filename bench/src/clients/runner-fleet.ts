/**
 * A load client for the runner scenarios, run as a child process (fork) so it never shares an
 * event loop with the server it measures. Two kinds of fleet:
 *
 * - `runner`: each socket is a runner speaking the real protocol (msgpack over `ws`, core's
 *   schemas): hello, the welcome's heartbeat interval, an `ack` for every command. With
 *   `stream`, after `go` every runner streams numbered output for its sandbox, keeping at most
 *   `window` frames of `batch` events unacknowledged, and times each frame from its send to
 *   the `appended` that covers it.
 * - `echo`: plain `ws` sockets to an echo server; after `go` they send `rate` small messages a
 *   second (over the fleet) and time each echo.
 *
 * Parent -> child: `start`, `go`, `stop`. Child -> parent: `connected` (progress), `ready`,
 * `tick` (every second while going), `done`.
 */
import {
  decodeFrame,
  encodeFrame,
  RUNNER_CONNECT_PATH,
  RUNNER_PROTOCOL_VERSION,
  type RunnerEvent,
  ServiceMessage,
} from '@svc/core';
import WebSocket from 'ws';
import { Histogram } from '../lib/stats.ts';

export interface FleetRunner {
  token: string;
  sandbox?: string;
  conversation?: string;
}

export type FleetStart =
  | {
      type: 'start';
      kind: 'runner';
      /** The service's base URL (http://127.0.0.1:port). */
      url: string;
      runners: FleetRunner[];
      localAddress: string;
      /** Connections opening at once (handshake to welcome). */
      concurrency: number;
      stream?: { batch: number; payloadBytes: number; window: number };
    }
  | { type: 'start'; kind: 'echo'; url: string; count: number; localAddress: string; concurrency: number };

export type FleetGo = { type: 'go'; rate?: number };

export interface FleetTick {
  type: 'tick';
  /** Events acknowledged (`appended`) so far, or echoes received. */
  acked: number;
  frames: number;
  /** This second's round trips (frame to ack, or message to echo). */
  p50: number;
  p99: number;
  count: number;
  open: number;
}

export interface FleetDone {
  type: 'done';
  acked: number;
  frames: number;
  /** `appended` messages received (one may cover several frames). */
  acks: number;
  histogram: number[];
  open: number;
  closes: Record<string, number>;
  errors: number;
  /** Connections tried again after ending before their welcome. */
  retries: number;
  errorSamples: string[];
}

const send = (m: unknown) => process.send?.(m);

interface Conn {
  ws: WebSocket;
  welcomed: boolean;
  epoch: number;
  heartbeat?: NodeJS.Timeout;
  runner?: FleetRunner;
  /** The batch this runner sends again and again (its conversation's id in each event). */
  events?: RunnerEvent[];
  nextSeq: number;
  hwm: number;
  inflight: { last: number; t0: number }[];
}

let conns: Conn[] = [];
let open = 0;
let errors = 0;
let retries = 0;
const errorSamples: string[] = [];
const closes: Record<string, number> = {};
let going = false;
let acked = 0;
let frames = 0;
let acks = 0;
const whole = new Histogram();
let second = new Histogram();
let stream: { batch: number; payloadBytes: number; window: number } | undefined;
let data = '';
let pingTimer: NodeJS.Timeout | undefined;
let tickTimer: NodeJS.Timeout | undefined;

function record(ms: number) {
  whole.record(ms);
  second.record(ms);
}

function pump(c: Conn) {
  const events = c.events;
  if (!going || !stream || !events || !c.runner?.sandbox || c.ws.readyState !== WebSocket.OPEN) return;
  while (c.inflight.length < stream.window) {
    const seq = c.nextSeq;
    c.nextSeq += events.length;
    c.inflight.push({ last: c.nextSeq - 1, t0: performance.now() });
    c.ws.send(encodeFrame({ t: 'output', sandbox: c.runner.sandbox, incarnation: 0, seq, events }));
    frames++;
  }
}

/**
 * Connects a runner and resolves once it is welcomed or given up. Like the runner-agent, a
 * connection that ends before its welcome is tried again (here up to 3 times, 200 ms apart).
 */
async function openRunner(url: string, runner: FleetRunner, localAddress: string): Promise<void> {
  for (let attempt = 0; attempt < 4; attempt++) {
    if (attempt > 0) {
      retries++;
      await new Promise((r) => setTimeout(r, 200));
    }
    if (await connectRunner(url, runner, localAddress)) return;
  }
}

function connectRunner(url: string, runner: FleetRunner, localAddress: string): Promise<boolean> {
  return new Promise((resolve) => {
    const ws = new WebSocket(`${url.replace(/^http/, 'ws')}${RUNNER_CONNECT_PATH}`, {
      headers: { authorization: `Bearer ${runner.token}` },
      localAddress,
      perMessageDeflate: false,
      handshakeTimeout: 30_000,
      maxPayload: 16 * 1024 * 1024,
    });
    const c: Conn = { ws, welcomed: false, epoch: 0, runner, nextSeq: 1, hwm: 0, inflight: [] };
    if (stream && runner.conversation) {
      const conversation_id = runner.conversation;
      c.events = Array.from({ length: stream.batch }, () => ({
        conversation_id,
        kind: 'output' as const,
        stream: 'stdout' as const,
        data,
      }));
    }
    conns.push(c);
    let settled = false;
    const settle = (welcomed: boolean) => {
      if (!settled) {
        settled = true;
        if (!welcomed) conns.splice(conns.indexOf(c), 1);
        resolve(welcomed);
      }
    };
    ws.on('open', () => {
      ws.send(
        encodeFrame({
          t: 'hello',
          protocol: RUNNER_PROTOCOL_VERSION,
          version: 'bench',
          instance: Math.random().toString(36).slice(2).padEnd(12, '0'),
          hostname: 'bench',
          root: '/bench',
          capabilities: [],
          sandboxes: runner.sandbox ? [{ id: runner.sandbox, incarnation: 0 }] : [],
        }),
      );
    });
    ws.on('message', (data, isBinary) => {
      if (!isBinary) return;
      const m = decodeFrame(ServiceMessage, new Uint8Array(data as Buffer));
      if (!m) return;
      if (m.t === 'welcome') {
        c.welcomed = true;
        c.epoch = m.epoch;
        open++;
        c.heartbeat = setInterval(() => {
          if (ws.readyState === WebSocket.OPEN) ws.send(encodeFrame({ t: 'heartbeat' }));
        }, m.heartbeat_ms);
        settle(true);
        pump(c);
      } else if (m.t === 'command') {
        if (m.epoch === c.epoch) ws.send(encodeFrame({ t: 'ack', n: m.n }));
      } else if (m.t === 'appended') {
        acks++;
        if (m.hwm > c.hwm) {
          acked += m.hwm - c.hwm;
          c.hwm = m.hwm;
        }
        const now = performance.now();
        while (c.inflight.length && (c.inflight[0] as { last: number }).last <= c.hwm) {
          record(now - (c.inflight.shift() as { t0: number }).t0);
        }
        pump(c);
      }
    });
    ws.on('error', (err) => {
      errors++;
      if (errorSamples.length < 5) errorSamples.push(err.message);
      settle(false);
    });
    ws.on('close', (code) => {
      if (c.welcomed) open--;
      c.welcomed = false;
      clearInterval(c.heartbeat);
      closes[code] = (closes[code] ?? 0) + 1;
      settle(false);
    });
  });
}

function openEcho(url: string, localAddress: string): Promise<void> {
  return new Promise((resolve) => {
    const ws = new WebSocket(url, { localAddress, perMessageDeflate: false, handshakeTimeout: 30_000 });
    const c: Conn = { ws, welcomed: false, epoch: 0, nextSeq: 0, hwm: 0, inflight: [] };
    conns.push(c);
    ws.on('open', () => {
      c.welcomed = true;
      open++;
      resolve();
    });
    ws.on('message', (data) => {
      const buf = data as Buffer;
      if (buf.length >= 8) {
        record(performance.now() - buf.readDoubleLE(0));
        acked++;
      }
    });
    ws.on('error', () => {
      errors++;
      resolve();
    });
    ws.on('close', (code) => {
      if (c.welcomed) open--;
      c.welcomed = false;
      closes[code] = (closes[code] ?? 0) + 1;
      resolve();
    });
  });
}

/** Opens `count` connections, at most `concurrency` at a time, reporting progress. */
async function openAll(count: number, concurrency: number, one: (i: number) => Promise<void>) {
  let next = 0;
  let lastReport = 0;
  const worker = async () => {
    while (next < count) {
      await one(next++);
      if (Date.now() - lastReport > 500) {
        lastReport = Date.now();
        send({ type: 'connected', open });
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker));
}

process.on('message', (m: FleetStart | FleetGo | { type: 'stop' } | { type: 'exit' }) => {
  void (async () => {
    if (m.type === 'start') {
      conns = [];
      if (m.kind === 'runner') {
        stream = m.stream;
        // A stdout chunk of `payloadBytes` bytes, ending in a newline like a line of output.
        if (stream) data = `${'x'.repeat(Math.max(0, stream.payloadBytes - 1))}\n`;
        await openAll(m.runners.length, m.concurrency, (i) =>
          openRunner(m.url, m.runners[i] as FleetRunner, m.localAddress),
        );
      } else {
        await openAll(m.count, m.concurrency, () => openEcho(m.url, m.localAddress));
      }
      send({ type: 'ready', open, errors, closes });
    } else if (m.type === 'go') {
      going = true;
      second = new Histogram();
      tickTimer = setInterval(() => {
        const s = second;
        second = new Histogram();
        send({
          type: 'tick',
          acked,
          frames,
          p50: s.percentile(50),
          p99: s.percentile(99),
          count: s.total,
          open,
        } satisfies FleetTick);
      }, 1000);
      if (stream) for (const c of conns) pump(c);
      if (m.rate && !stream) {
        // Echo fleet: `rate` messages a second over its sockets, spread in 10 ms slices.
        const perSlice = m.rate / 100;
        let owed = 0;
        const payload = Buffer.alloc(16);
        pingTimer = setInterval(() => {
          owed += perSlice;
          while (owed >= 1) {
            owed--;
            const c = conns[Math.floor(Math.random() * conns.length)];
            if (c?.ws.readyState !== WebSocket.OPEN) continue;
            payload.writeDoubleLE(performance.now(), 0);
            c.ws.send(payload);
            frames++;
          }
        }, 10);
      }
    } else if (m.type === 'stop') {
      going = false;
      clearInterval(pingTimer);
      clearInterval(tickTimer);
      send({
        type: 'done',
        acked,
        frames,
        acks,
        histogram: whole.toJSON(),
        open,
        closes,
        errors,
        retries,
        errorSamples,
      } satisfies FleetDone);
    } else if (m.type === 'exit') {
      for (const c of conns) {
        clearInterval(c.heartbeat);
        c.ws.terminate();
      }
      process.exit(0);
    }
  })();
});

process.on('disconnect', () => process.exit(0));
