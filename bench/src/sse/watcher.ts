/**
 * A load client process holding SSE watchers on raw sockets (forked by fleet.ts). It opens
 * its share of watchers from one loopback source address with a bounded number of openings
 * in flight, counts a watcher as held once the server's first comment arrives (`: connected`,
 * Nchan's `: hi`), and from then on finds each event's send time (`t:<ms since the epoch>`
 * in its data) and records send-to-receipt latency into one histogram per second of the
 * measurement. A slow watcher pauses its socket once held and never reads again.
 */
import { connect, type Socket } from 'node:net';
import { Histogram } from '../lib/stats.ts';

export interface WatcherSpec {
  path: string;
  authorization?: string;
  slow?: boolean;
}

export interface OpenJob {
  type: 'open';
  port: number;
  localAddress?: string;
  /** The comment that proves the stream is open. */
  ready: string;
  watchers: WatcherSpec[];
  /** Openings in flight at once. */
  inFlight: number;
}

export type ToWatcher = OpenJob | { type: 'measure'; from: number } | { type: 'report' } | { type: 'close' };

export interface WatcherStatus {
  type: 'status';
  opened: number;
  held: number;
  failed: number;
  closed: number;
  received: number;
}

export interface WatcherReport {
  type: 'report';
  held: number;
  failed: number;
  /** Held watchers the server closed (slow ones count only once they are read again). */
  closed: number;
  /** Events received by healthy watchers since `measure`. */
  received: number;
  /** Per second since `measure`: sparse histogram buckets `[bucket, count][]` of healthy watchers. */
  perSecond: [number, number][][];
  /** A slow watcher's fate at the end: still open, or closed by the server. */
  slowOpen: number;
  slowClosed: number;
  failures: string[];
}

const now = () => performance.timeOrigin + performance.now();

interface State {
  sock: Socket;
  spec: WatcherSpec;
  held: boolean;
  closed: boolean;
  carry: string;
}

const states: State[] = [];
let opened = 0;
let held = 0;
let failed = 0;
let closed = 0;
let received = 0;
let measureFrom = Number.POSITIVE_INFINITY;
const perSecond: Histogram[] = [];
const failures: string[] = [];

function record(at: number, sentAt: number): void {
  if (at < measureFrom) return;
  received++;
  const s = Math.floor((at - measureFrom) / 1000);
  let h = perSecond[s];
  if (!h) {
    h = new Histogram();
    perSecond[s] = h;
  }
  h.record(Math.max(0, at - sentAt));
}

const isTimeChar = (c: number) => (c >= 48 && c <= 57) || c === 46;

/** Finds every complete `t:<number>` in what arrived; keeps an incomplete one for the next chunk. */
function scan(st: State, chunk: string, at: number): void {
  const text = st.carry ? st.carry + chunk : chunk;
  st.carry = '';
  let i = 0;
  for (;;) {
    const k = text.indexOf('t:', i);
    if (k < 0) return;
    let j = k + 2;
    while (j < text.length && isTimeChar(text.charCodeAt(j))) j++;
    if (j === text.length) {
      st.carry = text.slice(k);
      return;
    }
    if (j > k + 2) record(at, Number(text.slice(k + 2, j)));
    i = j;
  }
}

function fail(st: State, why: string): void {
  if (st.closed) return;
  st.closed = true;
  if (st.held) closed++;
  else failed++;
  if (failures.length < 5) failures.push(why);
}

function open(job: OpenJob): void {
  let next = 0;
  let pending = 0;
  const pump = () => {
    while (pending < job.inFlight && next < job.watchers.length) {
      const spec = job.watchers[next++] as WatcherSpec;
      pending++;
      opened++;
      const sock = connect({ port: job.port, host: '127.0.0.1', localAddress: job.localAddress });
      const st: State = { sock, spec, held: false, closed: false, carry: '' };
      states.push(st);
      let head = '';
      const settle = () => {
        pending--;
        setImmediate(pump);
      };
      sock.setNoDelay(true);
      sock.on('error', (err) => {
        if (!st.held && !st.closed) settle();
        fail(st, err.message);
      });
      sock.on('close', () => {
        if (!st.held && !st.closed) settle();
        fail(st, st.held ? 'closed by the server' : `closed before ready: ${head.slice(0, 200)}`);
      });
      sock.on('data', (d: Buffer) => {
        const at = now();
        const text = d.toString('latin1');
        if (!st.held) {
          head += text;
          const r = head.indexOf(job.ready);
          if (r < 0) {
            // A refusal (401, 429, ...) is an answer, not a stream: count it failed now.
            const refused = head.includes('\r\n\r\n') && !/^HTTP\/1\.1 200 /.test(head);
            if (refused || head.length > 4096) sock.destroy(new Error(`no ${job.ready} in ${head.slice(0, 200)}`));
            return;
          }
          st.held = true;
          held++;
          settle();
          if (spec.slow) sock.pause();
          else scan(st, head.slice(r + job.ready.length), at);
          head = '';
          return;
        }
        if (!spec.slow) scan(st, text, at);
      });
      const auth = spec.authorization ? `authorization: ${spec.authorization}\r\n` : '';
      sock.write(
        `GET ${spec.path} HTTP/1.1\r\nhost: 127.0.0.1:${job.port}\r\naccept: text/event-stream\r\n${auth}\r\n`,
      );
    }
  };
  pump();
}

/**
 * The report. Slow watchers read again first: a paused socket learns that the server closed
 * it only by reading what the kernel still holds for it.
 */
async function report(): Promise<void> {
  const slow = states.filter((st) => st.spec.slow && st.held);
  for (const st of slow) st.sock.resume();
  let before = -1;
  const deadline = Date.now() + 8000;
  while (slow.length && Date.now() < deadline && before !== closed) {
    before = closed;
    await new Promise((r) => setTimeout(r, 1000));
  }
  const slowClosed = slow.filter((st) => st.closed).length;
  const out: WatcherReport = {
    type: 'report',
    held,
    failed,
    closed,
    received,
    perSecond: Array.from(perSecond, (h) => {
      const sparse: [number, number][] = [];
      if (!h) return sparse;
      for (let b = 0; b < h.counts.length; b++)
        if ((h.counts[b] as number) > 0) sparse.push([b, h.counts[b] as number]);
      return sparse;
    }),
    slowOpen: slow.length - slowClosed,
    slowClosed,
    failures,
  };
  process.send?.(out);
}

const status = (): WatcherStatus => ({ type: 'status', opened, held, failed, closed, received });

process.on('message', (m: ToWatcher) => {
  if (m.type === 'open') open(m);
  else if (m.type === 'measure') measureFrom = m.from;
  else if (m.type === 'report') void report();
  else if (m.type === 'close') {
    resetAll();
    setTimeout(() => process.exit(0), 50);
  }
});

/**
 * Closes every socket with a reset, not a FIN: a closed connection then leaves no TIME_WAIT
 * socket behind (60 s each). 127,570 of them, left by sse-idle's watchers, were still being
 * torn down while the next scenario's first system (ours, in sse-fanout) was measured: 14%
 * more CPU per delivery than the same scenario run alone (one pair of runs; server, Redis and
 * Postgres alike), while Nchan, measured a minute later, was not touched. The fleet is
 * told to close and then stopped (SIGTERM), so both do it: whichever comes first.
 */
function resetAll(): void {
  for (const st of states) {
    st.closed = true;
    if (!st.sock.destroyed) st.sock.resetAndDestroy();
  }
}
process.on('SIGTERM', () => {
  resetAll();
  process.exit(0);
});
setInterval(() => process.send?.(status()), 500).unref();
process.on('disconnect', () => process.exit(0));
