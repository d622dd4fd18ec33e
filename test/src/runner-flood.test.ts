/**
 * A runner connection may have only RUNNER_MAX_QUEUED_BYTES of output waiting to be appended:
 * past it the connection is closed with `going_away` (the runner resends what was not
 * acknowledged), so a runner that ignores acknowledgements cannot fill the node's memory.
 */
import {
  decodeFrame,
  encodeFrame,
  RUNNER_CLOSE,
  RUNNER_PROTOCOL_VERSION,
  type RunnerMessage,
  ServiceMessage,
} from '@svc/core';
import t from 'tap';
import WebSocket from 'ws';
import { signUp, startTestService, transportSetups } from './harness.ts';

const LIMIT = 64 * 1024;
/** Bytes of output text per frame. */
const CHUNK = 8 * 1024;

interface Raw {
  ws: WebSocket;
  /** The service's messages so far, decoded. */
  messages: ServiceMessage[];
  /** Resolves with the message number `n` (1-based) once it has arrived. */
  nth(n: number): Promise<ServiceMessage>;
  closed: Promise<{ code: number; reason: string }>;
}

function connect(url: string, token: string): Promise<Raw> {
  const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/api/runners/connect`, {
    headers: { authorization: `Bearer ${token}` },
  });
  const messages: ServiceMessage[] = [];
  const waiting: { n: number; resolve: (m: ServiceMessage) => void }[] = [];
  ws.on('message', (data: Buffer) => {
    const m = decodeFrame(ServiceMessage, new Uint8Array(data));
    if (!m) return;
    messages.push(m);
    for (const w of waiting.filter((x) => x.n <= messages.length)) {
      waiting.splice(waiting.indexOf(w), 1);
      w.resolve(messages[w.n - 1] as ServiceMessage);
    }
  });
  ws.on('error', () => {});
  const closed = new Promise<{ code: number; reason: string }>((resolve) =>
    ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() })),
  );
  const nth = (n: number) =>
    n <= messages.length
      ? Promise.resolve(messages[n - 1] as ServiceMessage)
      : new Promise<ServiceMessage>((resolve) => waiting.push({ n, resolve }));
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve({ ws, messages, nth, closed }));
    ws.once('error', reject);
  });
}

const hello = (instance: string): RunnerMessage => ({
  t: 'hello',
  protocol: RUNNER_PROTOCOL_VERSION,
  version: '0.0.0',
  instance,
  hostname: 'flood',
  root: '/flood',
  capabilities: [],
  sandboxes: [],
});

/** Output of a sandbox the service does not know: each frame is answered `discard`. */
const output = (seq: number): RunnerMessage => ({
  t: 'output',
  sandbox: 'sbx_unknown',
  incarnation: 0,
  seq,
  events: [{ conversation_id: 'cnv_x', kind: 'output', stream: 'stdout', data: 'x'.repeat(CHUNK) }],
});

for (const { backend, edge } of transportSetups()) {
  t.test(`queued runner output is bounded on ${backend}, ${edge ? 'edge' : 'api role alone'}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: { RUNNER_MAX_QUEUED_BYTES: String(LIMIT), EDGE: String(edge) },
    });
    const me = await signUp(svc);
    const token = async (name: string) =>
      (await svc.http.post('/api/runners', { token: me.key, body: { name } })).body.token as string;

    t.test('a runner that waits for answers may send any amount, frame after frame', async (t) => {
      const r = await connect(svc.url, await token('paced'));
      r.ws.send(encodeFrame(hello('paced0000000001')));
      t.equal((await r.nth(1)).t, 'welcome');
      const frames = Math.ceil((4 * LIMIT) / CHUNK);
      for (let i = 1; i <= frames; i++) {
        r.ws.send(encodeFrame(output(i)));
        const answer = await r.nth(1 + i);
        if (answer.t !== 'discard') return t.fail(`frame ${i} answered ${answer.t}`);
      }
      t.equal(
        r.ws.readyState,
        WebSocket.OPEN,
        `${frames * CHUNK} bytes in all, one frame waiting at a time: still open`,
      );
      r.ws.close();
    });

    t.test('a runner that floods past the bound is closed going_away, and may connect again', async (t) => {
      const tok = await token('flood');
      const r = await connect(svc.url, tok);
      r.ws.send(encodeFrame(hello('flood0000000001')));
      t.equal((await r.nth(1)).t, 'welcome');
      // 32 times the bound, sent at once: far more than one append can take away meanwhile.
      for (let i = 1; i <= Math.ceil((32 * LIMIT) / CHUNK); i++) r.ws.send(encodeFrame(output(i)));
      const { code, reason } = await Promise.race([
        r.closed,
        new Promise<{ code: number; reason: string }>((resolve) =>
          setTimeout(() => resolve({ code: 0, reason: 'still open after 20 s' }), 20_000).unref(),
        ),
      ]);
      t.equal(code, RUNNER_CLOSE.going_away);
      t.match(reason, /bytes of output waiting to be appended; reconnect and resend/);
      const again = await connect(svc.url, tok);
      again.ws.send(encodeFrame(hello('flood0000000001')));
      t.equal((await again.nth(1)).t, 'welcome', 'the runner is welcome again');
      again.ws.close();
    });
  });
}
