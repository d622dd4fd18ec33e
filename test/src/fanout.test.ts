import { connect, type Socket } from 'node:net';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { backends, signUp, startTestService, type TestService } from './harness.ts';
import { settlesWithin } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A watcher that keeps only what it must: bytes received, and the event numbers it saw in
 * order (each event's data starts with `<n>:`), so a hundred of them reading megabytes each
 * stay cheap for the test process.
 */
function watcher(svc: TestService, path: string, key: string, paused = false) {
  const url = new URL(svc.url);
  const sock: Socket = connect(Number(url.port), url.hostname);
  const seen: number[] = [];
  let bytes = 0;
  let carry = '';
  const closed = new Promise<void>((resolve) => sock.on('close', () => resolve()));
  sock.on('error', () => {});
  sock.on('data', (d: Buffer) => {
    bytes += d.length;
    // Keep the tail of the previous chunk so a marker split across chunks is still found.
    const text = carry + d.toString('latin1');
    for (const m of text.matchAll(/"data":"(\d+):/g)) seen.push(Number(m[1]));
    carry = text.slice(-24);
    if (/"data":"\d*$/.test(carry) === false) carry = '';
  });
  if (paused) sock.pause();
  sock.write(`GET ${path} HTTP/1.1\r\nhost: ${url.host}\r\nauthorization: Bearer ${key}\r\nconnection: close\r\n\r\n`);
  return { sock, closed, seen, bytes: () => bytes };
}

// One backend is enough here: the fan-out is the edge's, the same over either log adapter;
// Redis when the suite has it, as in production.
const [backend] = backends();

t.test(`a watcher that reads nothing while 100 others read (${backend})`, async (t) => {
  const maxBuffer = 256 * 1024;
  const svc = await startTestService(t, {
    backend,
    env: {
      SSE_HEARTBEAT_MS: '1000',
      SSE_IDLE_CLOSE_MS: '30000',
      SSE_MAX_BUFFER_BYTES: String(maxBuffer),
    },
  });
  const me = await signUp(svc);
  const conv = await createConversationRecord(
    svc.db.sql,
    { accountId: me.accountId, actor: 'api', ip: null },
    { agentId: 'agt_x', title: 'flood' },
  );
  await sleep(300); // the creation's `conversations` event is relayed before anyone watches

  const readers = Array.from({ length: 100 }, () => watcher(svc, '/api/events/stream', me.key));
  const slow = watcher(svc, '/api/events/stream', me.key, true);
  t.teardown(() => {
    for (const r of readers) r.sock.destroy();
    slow.sock.destroy();
  });
  await sleep(500);

  const chunk = 'x'.repeat(32 * 1024);
  const sent = 160; // 5 MB to each watcher: far past what loopback buffers hold for the paused one
  for (let i = 0; i < sent; i++) {
    const r = await svc.appendEvents({
      tenant: me.accountId,
      producer: 'flood',
      seq: i + 1,
      events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data: `${i}:${chunk}` }],
    });
    t.equal(r.status, 'appended');
    if (i % 16 === 15) await sleep(5);
  }
  const expected = Array.from({ length: sent }, (_, i) => i);
  for (let i = 0; i < 400 && readers.some((r) => r.seen.length < sent); i++) await sleep(50);
  const complete = readers.filter((r) => r.seen.length === sent && r.seen.every((n, i) => n === expected[i]));
  t.equal(complete.length, 100, 'all 100 reading watchers got every event once, in order');

  slow.sock.resume();
  const cut = await settlesWithin(slow.closed, 5000);
  t.ok(cut, 'the watcher that read nothing was disconnected');
  t.ok(slow.seen.length < sent, `it got ${slow.seen.length} of ${sent} before the cut; it resumes with Last-Event-ID`);
  t.ok(
    slow.bytes() < sent * chunk.length,
    `what it was sent (${slow.bytes()} bytes) stayed far below the flood: the edge did not buffer it all`,
  );
  t.ok(
    readers.every((r) => !r.sock.destroyed),
    'the readers are still connected',
  );
});
