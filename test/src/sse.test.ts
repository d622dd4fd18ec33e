import { conversations } from '@svc/db';
import { EventSource } from 'eventsource';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { signUp, startTestService, transportSetups } from './harness.ts';
import { frames, rawGet } from './sse-client.ts';
import { settlesWithin } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

for (const { backend, edge } of transportSetups()) {
  t.test(
    `the conversation stream on ${backend}, ${edge ? 'through the edge' : 'api role alone (EDGE=false)'}`,
    async (t) => {
      const svc = await startTestService(t, {
        backend,
        env: {
          EDGE: String(edge),
          SSE_HEARTBEAT_MS: '100',
          SSE_IDLE_CLOSE_MS: '1500',
          SSE_MAX_BUFFER_BYTES: '1048576',
          API_CORS_ORIGINS: 'https://app.example',
        },
      });
      const me = await signUp(svc);
      const other = await signUp(svc);
      const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
      const conv = await createConversationRecord(svc.db.sql, who, { agentId: 'agt_x', title: 'c' });
      const auth = { authorization: `Bearer ${me.key}` };
      let seq = 0;
      const append = (events: object[]) =>
        svc.appendEvents({
          tenant: me.accountId,
          producer: 'test',
          seq: ++seq,
          events: events.map((e) => ({ conversationId: conv.id, kind: 'output', stream: 'stdout', ...e })),
          seqs: events.map(() => seq),
        });
      await append([{ data: 'one' }]);
      await append([{ data: 'two' }]);
      await append([{ kind: 'stage', stream: 'stage', stage: 'turn', state: 'done', durationMs: 5 }]);

      t.test("another tenant's conversation is 404 before any byte of stream; no key is 401", async (t) => {
        const theirs = rawGet(svc, `/api/conversations/${conv.id}/stream`, { authorization: `Bearer ${other.key}` });
        await theirs.closed.catch(() => {});
        await sleep(100);
        t.match(theirs.text(), /^HTTP\/1\.1 404 /);
        t.notMatch(theirs.text(), /text\/event-stream|connected/);
        theirs.sock.destroy();
        const res = await fetch(`${svc.url}/api/conversations/${conv.id}/stream`);
        t.equal(res.status, 401);
        t.equal(((await res.json()) as { error: string }).error, 'unauthorized');
      });

      t.test('wait=false on an idle conversation: history, framed byte for byte, then the end', async (t) => {
        const c = rawGet(svc, `/api/conversations/${conv.id}/stream`, auth);
        await c.closed;
        const raw = c.text();
        t.match(raw, /^HTTP\/1\.1 200 OK\r\n/);
        t.match(raw, /content-type: text\/event-stream/i);
        const f = frames(raw);
        t.equal(f[0], ': connected');
        const events = f.filter((x) => x.startsWith('id: '));
        t.equal(events.length, 3);
        for (const frame of events) {
          const m = /^id: (\d+)\ndata: (\{.*\})$/.exec(frame);
          t.ok(m, `frame is "id: <n>\\ndata: <json>": ${JSON.stringify(frame)}`);
          t.equal(JSON.parse(m?.[2] as string).id, Number(m?.[1]), 'the id line matches the payload');
        }
        t.same(
          events.map((x) => JSON.parse(x.split('\ndata: ')[1] as string).data),
          ['one', 'two', null],
        );
      });

      t.test('Last-Event-ID resumes after that id; streams filters', async (t) => {
        const all = await svc.http.get(`/api/conversations/${conv.id}/events`, { token: me.key });
        const firstId = all.body.data[0].id;
        const c = rawGet(svc, `/api/conversations/${conv.id}/stream`, { ...auth, 'last-event-id': String(firstId) });
        await c.closed;
        const ids = frames(c.text())
          .filter((x) => x.startsWith('id: '))
          .map((x) => Number(/^id: (\d+)/.exec(x)?.[1]));
        t.same(
          ids,
          all.body.data.slice(1).map((e: { id: number }) => e.id),
        );
        const q = rawGet(svc, `/api/conversations/${conv.id}/stream?streams=stage&last_event_id=0`, auth);
        await q.closed;
        t.equal(frames(q.text()).filter((x) => x.startsWith('id: ')).length, 1, 'only the stage event');
        const b = rawGet(svc, `/api/conversations/${conv.id}/stream?blocks=true&last_event_id=0`, auth);
        await b.closed;
        const firstEvent = frames(b.text()).find((x) => x.startsWith('id: ')) as string;
        t.same(
          JSON.parse(firstEvent.split('\ndata: ')[1] as string).blocks,
          [{ kind: 'raw', body: 'one', summary: 'one' }],
          'blocks=true parses',
        );
        const cors = await fetch(`${svc.url}/api/conversations/${conv.id}/stream`, {
          headers: { ...auth, origin: 'https://app.example' },
        });
        t.equal(
          cors.headers.get('access-control-allow-origin'),
          'https://app.example',
          'an allowed origin may read the stream',
        );
        await cors.text();
        const stranger = await fetch(`${svc.url}/api/conversations/${conv.id}/stream`, {
          headers: { ...auth, origin: 'https://evil.example' },
        });
        t.equal(stranger.headers.get('access-control-allow-origin'), null);
        await stranger.text();
        const bad = await fetch(`${svc.url}/api/conversations/${conv.id}/stream?streams=video`, { headers: auth });
        t.equal(bad.status, 400);
      });

      t.test('a heartbeat fills a silence: none while events come faster than it', async (t) => {
        const c = rawGet(
          svc,
          `/api/conversations/${conv.id}/stream?wait=true&last_event_id=${await svc.eventLog.lastId(me.accountId)}`,
          auth,
        );
        await sleep(350);
        t.match(c.text(), /: heartbeat/, 'beats while nothing happens');
        const before = c.text().length;
        // An event every 20 ms for 600 ms: six heartbeat intervals, never 100 ms of silence
        // unless this shared machine stalls; each gap of 100 ms or more between two appends is
        // a real silence, and may hold a beat.
        let stalls = 0;
        let last = Date.now();
        for (let i = 0; i < 30; i++) {
          await append([{ data: `busy-${i}` }]);
          const now = Date.now();
          if (now - last >= 100) stalls++;
          last = now;
          await sleep(20);
        }
        const during = c.text().slice(before);
        t.match(during, /busy-29/, 'every event arrived');
        // One beat beyond those: a stall may also come between an append and its delivery.
        const beats = (during.match(/: heartbeat/g) ?? []).length;
        t.ok(beats <= 1 + stalls, 'no heartbeat while events keep the stream warm', { beats, stalls });
        await sleep(350);
        t.match(c.text().slice(before + during.length), /: heartbeat/, 'beats again once the events stop');
        c.sock.destroy();
      });

      t.test('a running turn streams live until it ends; heartbeats keep it warm', async (t) => {
        await conversations.startTurn(svc.db.sql, {
          id: 'trn_live',
          accountId: me.accountId,
          conversationId: conv.id,
          prompt: 'go',
          origin: 'user',
        });
        const c = rawGet(
          svc,
          `/api/conversations/${conv.id}/stream?last_event_id=${await svc.eventLog.lastId(me.accountId)}`,
          auth,
        );
        await sleep(350);
        t.match(c.text(), /: heartbeat/, 'heartbeats while nothing happens');
        await append([{ data: 'live-1' }]);
        await append([{ data: 'live-2' }]);
        await sleep(100);
        t.match(c.text(), /live-1/);
        await append([{ kind: 'stage', stream: 'stage', stage: 'turn', state: 'done' }]);
        await conversations.endTurn(svc.db.sql, me.accountId, 'trn_live', 'done', null);
        await c.closed;
        const datas = frames(c.text())
          .filter((x) => x.startsWith('id: '))
          .map((x) => JSON.parse(x.split('\ndata: ')[1] as string).data);
        t.same(datas, ['live-1', 'live-2', null], 'live events in order, then the end at the turn end');
      });

      t.test('the eventsource client reconnects with Last-Event-ID and misses nothing', async (t) => {
        const seen: number[] = [];
        const es = new EventSource(`${svc.url}/api/conversations/${conv.id}/stream?wait=true`, {
          fetch: (input, init) => fetch(input, { ...init, headers: { ...(init?.headers ?? {}), ...auth } }),
        });
        let opens = 0;
        es.addEventListener('open', () => {
          opens++;
        });
        es.addEventListener('message', (m) => {
          seen.push(Number(m.lastEventId));
        });
        t.teardown(() => es.close());
        await sleep(300);
        const before = seen.length;
        t.ok(before >= 6, `history arrived (${before})`);
        // The server closes after 1.5 s without events; the client comes back on its own after its
        // retry delay (3 s by default).
        for (let i = 0; i < 80 && opens < 2; i++) await sleep(100);
        t.ok(opens >= 2, `reconnected (${opens} opens)`);
        await append([{ data: 'after-reconnect' }]);
        await sleep(300);
        const all = (
          await svc.http.get(`/api/conversations/${conv.id}/events?limit=1000`, { token: me.key })
        ).body.data.map((e: { id: number }) => e.id);
        t.same(seen, all, 'every event once, in order, across the reconnect');
      });

      t.test('a long replay waits for a slow reader instead of cutting it off, page by page', async (t) => {
        const history = await createConversationRecord(svc.db.sql, who, { agentId: 'agt_x', title: 'history' });
        const from = await svc.eventLog.lastId(me.accountId);
        const chunk = 'y'.repeat(5 * 1024);
        // 12.5 MB of history (SSE_MAX_BUFFER_BYTES is 1 MiB; loopback buffers absorb a few MB),
        // read in pages of 1000 events, the first page alone far beyond the limit.
        const total = 2500;
        const batch = 100;
        for (let i = 0; i < total; i += batch) {
          await svc.appendEvents({
            tenant: me.accountId,
            producer: 'history',
            seq: i + 1,
            events: Array.from({ length: batch }, (_, j) => ({
              conversationId: history.id,
              kind: 'output',
              stream: 'stdout',
              data: `${i + j}:${chunk}`,
            })),
          });
        }
        const slow = rawGet(svc, `/api/conversations/${history.id}/stream?last_event_id=${from}`, auth, {
          paused: true,
        });
        // Paused for twice the idle close (1.5 s) while the next page waits for it: a replay
        // is not idle, so the stream is not ended between pages.
        await sleep(3000);
        slow.sock.resume();
        const count = () => (slow.text().match(/"data":"\d+:y/g) ?? []).length;
        // Patient (12 MB on a loaded machine can take many seconds); ends once all arrived.
        for (let i = 0; i < 1200 && count() < total; i++) await sleep(50);
        t.equal(count(), total, 'every event of the history arrives, in one connection');
        const ids = frames(slow.text())
          .map((f) => /"data":"(\d+):/.exec(f)?.[1])
          .filter((x) => x !== undefined)
          .map(Number);
        t.same(
          ids,
          Array.from({ length: total }, (_, i) => i),
          'in order, once each',
        );
        await settlesWithin(slow.closed, 5000);
        t.ok(slow.text().endsWith('\r\n0\r\n\r\n'), 'the stream ended as it should, not cut short');
        slow.sock.destroy();
      });

      t.test('a watcher that reads nothing is cut off with bounded memory; others are not slowed', async (t) => {
        await conversations.startTurn(svc.db.sql, {
          id: 'trn_big',
          accountId: me.accountId,
          conversationId: conv.id,
          prompt: 'flood',
          origin: 'user',
        });
        const from = await svc.eventLog.lastId(me.accountId);
        const slow = rawGet(svc, `/api/conversations/${conv.id}/stream?last_event_id=${from}`, auth, { paused: true });
        const fast = rawGet(svc, `/api/conversations/${conv.id}/stream?last_event_id=${from}`, auth);
        await sleep(200);
        const chunk = 'x'.repeat(64 * 1024);
        // 20 MB: more than the kernel's socket buffers on loopback can absorb for the slow one,
        // at a producer's pace (a pause every 8 events), which a reading client keeps up with.
        const sent = 320;
        for (let i = 0; i < sent; i++) {
          await append([{ data: `${i}:${chunk}` }]);
          if (i % 8 === 7) await sleep(2);
        }
        // Wait until the reader has at least every payload's bytes, then count once.
        for (let i = 0; i < 200 && fast.text().length < sent * chunk.length; i++) await sleep(50);
        const got = (fast.text().match(/"data":"\d+:x/g) ?? []).length;
        t.equal(got, sent, 'the reading watcher got every event');
        // A paused socket notices nothing; once it reads again it finds the connection cut short.
        slow.sock.resume();
        const closedInTime = await settlesWithin(slow.closed, 5000);
        t.ok(closedInTime, 'the slow watcher was disconnected');
        const slowGot = (slow.text().match(/"data":"\d+:x/g) ?? []).length;
        t.ok(slowGot < sent, `it received ${slowGot} of ${sent} before the cut; it resumes with Last-Event-ID`);
        fast.sock.destroy();
        slow.sock.destroy();
      });
    },
  );
}

t.test('watchers that open together do not all get their heartbeats in the same tick', async (t) => {
  // 1 s heartbeats, checked every 250 ms: watchers beating on the clock of their opening would
  // all beat within a tick or two; the first beat of each is due at a random moment instead.
  const svc = await startTestService(t, { env: { SSE_HEARTBEAT_MS: '1000', SSE_IDLE_CLOSE_MS: '0' } });
  const me = await signUp(svc);
  const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
  const conv = await createConversationRecord(svc.db.sql, who, { agentId: 'agt_x', title: 'quiet' });
  const watchers = Array.from({ length: 24 }, () => {
    const w = rawGet(svc, `/api/conversations/${conv.id}/stream?wait=true`, { authorization: `Bearer ${me.key}` });
    const beat = new Promise<number>((resolve) => {
      const check = () => (w.text().includes(': heartbeat') ? resolve(Date.now()) : setTimeout(check, 5));
      check();
    });
    return { w, beat };
  });
  const firstBeats = await Promise.all(watchers.map((x) => x.beat));
  const spread = Math.max(...firstBeats) - Math.min(...firstBeats);
  t.ok(spread >= 400, `the first heartbeats are spread over ${spread} ms of the 1000 ms interval`);
  for (const { w } of watchers) w.sock.destroy();
});
