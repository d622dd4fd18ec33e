import { type IncomingMessage, request } from 'node:http';
import { logEvents } from '@svc/db';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { signUp, startTestService, type TestService, transportSetups } from './harness.ts';
import { until } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// Three setups of a heavy scenario on a shared machine: more than the default file timeout.
t.setTimeout(transportSetups().length * 150_000);

const WATCHERS = 40;
const CHUNKS = 3000;
/** A chunk's text: large enough that a reader that pauses fills the socket's buffers. */
const filler = 'x'.repeat(500);

/**
 * One SSE request to `path` resuming from `lastEventId`: `onFrames` is handed the whole frames
 * of each chunk as they arrive (with the response, to pause it); resolves once it closed.
 */
function resumed(
  svc: TestService,
  path: string,
  key: string,
  lastEventId: number,
  onFrames: (frames: string[], res: IncomingMessage) => void,
) {
  const url = new URL(svc.url);
  let done!: () => void;
  const closed = new Promise<void>((resolve) => {
    done = resolve;
  });
  const req = request(
    {
      host: url.hostname,
      port: url.port,
      path,
      agent: false,
      headers: { authorization: `Bearer ${key}`, 'last-event-id': String(lastEventId) },
    },
    (res) => {
      res.setEncoding('utf8');
      let pending = '';
      res.on('data', (chunk: string) => {
        pending += chunk;
        const frames: string[] = [];
        for (let end = pending.indexOf('\n\n'); end >= 0; end = pending.indexOf('\n\n')) {
          frames.push(pending.slice(0, end));
          pending = pending.slice(end + 2);
        }
        onFrames(frames, res);
      });
      res.on('close', done);
    },
  );
  req.on('error', done);
  req.end();
  return { req, closed };
}

/**
 * A client that keeps its place as the WHATWG EventSource does: an `id:` field takes effect
 * when its frame is dispatched (at the blank line), whether or not the frame carries data. It
 * drops its connection at random moments and resumes with `Last-Event-ID`, until `done()`.
 */
function chaoticWatcher(svc: TestService, path: string, key: string, from: number, done: (w: Received) => boolean) {
  const received: Received = { lastId: from, messages: [], connections: 0, silent: undefined };
  const finished = (async () => {
    while (!done(received)) {
      received.connections++;
      // Dropped at a random moment, but only once this connection has been sent an event: a
      // connection that is sent nothing stays open, so a resume that goes silent shows.
      let dropDue = false;
      let heard = false;
      const { req, closed } = resumed(svc, path, key, received.lastId, (frames, res) => {
        for (const frame of frames) if (dispatch(received, frame)) heard = true;
        if (done(received) || (dropDue && heard)) req.destroy();
        // A reader that stalls now and then, so the server meets backpressure.
        else if (Math.random() < 0.05) {
          res.pause();
          setTimeout(() => res.resume(), Math.random() * 300);
        }
      });
      received.silent = { lastEventId: received.lastId, req };
      setTimeout(
        () => {
          dropDue = true;
          if (heard) req.destroy();
        },
        200 + Math.random() * 1000,
      );
      await closed;
    }
  })();
  return { received, finished };
}

/** How long a last resume reads: far shorter than any heartbeat, long enough for a slow machine. */
const FINAL_READ_MS = 10_000;

/** One resume from `from`: the messages it is sent until it has `count` or FINAL_READ_MS pass. */
async function readFor(svc: TestService, path: string, key: string, from: number, count: number) {
  const received: Received = { lastId: from, messages: [], connections: 1, silent: undefined };
  const { req, closed } = resumed(svc, path, key, from, (frames) => {
    for (const frame of frames) dispatch(received, frame);
    if (received.messages.length >= count) req.destroy();
  });
  const timer = setTimeout(() => req.destroy(), FINAL_READ_MS);
  await closed;
  clearTimeout(timer);
  return received.messages;
}

interface Received {
  lastId: number;
  messages: { id: number; conversation_id?: string; data: string }[];
  connections: number;
  /** The connection open now and the Last-Event-ID it resumed from. */
  silent: { lastEventId: number; req: { destroy(): void } } | undefined;
}

/** Takes a frame as the WHATWG parser does; true when it fired a message. */
function dispatch(received: Received, frame: string): boolean {
  let id: string | undefined;
  let event: string | undefined;
  let data: string | undefined;
  for (const line of frame.split('\n')) {
    if (line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = line.slice(0, colon);
    const value = line.slice(colon + 1).replace(/^ /, '');
    if (field === 'id') id = value;
    else if (field === 'event') event = value;
    else if (field === 'data') data = value;
  }
  if (id !== undefined) received.lastId = Number(id);
  if (data === undefined || event !== undefined) return false;
  received.messages.push({ id: Number(id), ...JSON.parse(data) });
  return true;
}

for (const { backend, edge } of transportSetups()) {
  t.test(
    `${WATCHERS} watchers of /api/events/stream that drop and resume at random during a burst of ${CHUNKS} chunks each get every event once, in order, on ${backend}, ${edge ? 'through the edge' : 'api role alone (EDGE=false)'}`,
    async (t) => {
      const svc = await startTestService(t, {
        backend,
        // No heartbeat within the test and no idle close: only events move a watcher on.
        env: { EDGE: String(edge), SSE_HEARTBEAT_MS: '3600000', SSE_IDLE_CLOSE_MS: '0' },
      });
      const me = await signUp(svc);
      const conv = await createConversationRecord(
        svc.db.sql,
        { accountId: me.accountId, actor: 'api', ip: null },
        { agentId: 'agt_chaos', title: 'chaos' },
      );
      // The creation's `conversations` event is relayed before the watchers take their place.
      for (let i = 0; i < 200 && (await svc.eventLog.lastId(me.accountId)) === 0; i++) await sleep(25);
      const start = await svc.eventLog.lastId(me.accountId);
      t.ok(start > 0, 'the log has a position to resume from');
      let lastAppended = start;

      let burstOver = false;
      let abandoned = false;
      const caughtUp = (r: Received) => burstOver && r.lastId >= lastAppended;
      const watchers = Array.from({ length: WATCHERS }, () =>
        chaoticWatcher(svc, '/api/events/stream', me.key, start, (r) => abandoned || caughtUp(r)),
      );
      for (let seq = 1; seq <= CHUNKS; seq++) {
        const r = await svc.appendEvents({
          tenant: me.accountId,
          producer: 'chaos',
          seq,
          events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data: `chunk ${seq} ${filler}` }],
        });
        lastAppended = r.events.at(-1)?.id ?? lastAppended;
        // Spread the burst over the watchers' drops rather than finishing it before the first.
        if (seq % 100 === 0) await sleep(40);
      }
      burstOver = true;
      // A watcher that resumed just before the burst ended may already hold every event: it is
      // sent nothing more (no heartbeat here), so its open connection would never see that it
      // is done. End those connections, as the next event would have; a watcher still behind
      // keeps its connection, so a resume that goes silent still shows.
      const sweep = setInterval(() => {
        for (const w of watchers) if (caughtUp(w.received)) w.received.silent?.req.destroy();
      }, 100);
      t.teardown(() => clearInterval(sweep));
      let deadline: NodeJS.Timeout | undefined;
      const all = await Promise.race([
        Promise.all(watchers.map((w) => w.finished)).then(() => true),
        new Promise<false>((resolve) => {
          deadline = setTimeout(() => resolve(false), 120_000);
        }),
      ]);
      clearTimeout(deadline);
      clearInterval(sweep);
      const stuck = watchers.filter((w) => !caughtUp(w.received)).map((w) => w.received.silent?.lastEventId);
      t.ok(all, `every watcher caught up with the log (stuck resumes from: ${stuck.join(', ')})`);
      abandoned = true;
      for (const w of watchers) w.received.silent?.req.destroy();

      const feed: { id: number; data: string }[] = [];
      for (let after = start; ; ) {
        const page = await svc.http.get(`/api/conversations/${conv.id}/events?after=${after}&limit=1000`, {
          token: me.key,
        });
        feed.push(...page.body.data);
        if (!page.body.meta.has_more) break;
        after = page.body.meta.next_cursor;
      }
      t.equal(feed.length, CHUNKS, 'the JSON feed holds the burst');
      const expected = feed.map((e) => [e.id, conv.id, e.data]);
      for (const [i, w] of watchers.entries()) {
        const got = w.received.messages.map((m) => [m.id, m.conversation_id, m.data]);
        t.same(got, expected, `watcher ${i} (${w.received.connections} connections) got the feed exactly`);
      }
      t.ok(
        watchers.every((w) => w.received.connections > 1),
        'every watcher dropped and resumed at least once',
      );

      // A resume delivers at once, not at the next write: once the burst is copied to Postgres,
      // each watcher resumes once more from its own place in the burst's tail (100 to 880
      // events back) and reads for a while far shorter than the heartbeat (which is off here).
      // On Postgres the durable copy is locked meanwhile: the hot log still holds the tail, so
      // a resume must not wait on the copy.
      await until(
        'the burst is copied',
        async () => (await logEvents.copiedUpTo(svc.db.sql, me.accountId)) >= lastAppended,
      );
      const resumeAll = () =>
        Promise.all(
          watchers.map(async (_, i) => {
            const from = feed.length - 1 - (100 + i * 20);
            const tail = expected.slice(from + 1);
            const got = await readFor(
              svc,
              '/api/events/stream',
              me.key,
              (feed[from] as { id: number }).id,
              tail.length,
            );
            return { tail, got: got.map((m) => [m.id, m.conversation_id, m.data]) };
          }),
        );
      const resumed =
        backend === 'postgres+redis'
          ? await svc.db.sql.begin(async (tx) => {
              await tx`LOCK TABLE log_events IN ACCESS EXCLUSIVE MODE`;
              return resumeAll();
            })
          : await resumeAll();
      for (const [i, r] of resumed.entries()) {
        t.same(r.got, r.tail, `watcher ${i}'s last resume got its ${r.tail.length} events within ${FINAL_READ_MS} ms`);
      }
    },
  );
}
