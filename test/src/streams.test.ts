import { outbox } from '@svc/db';
import { EventSource } from 'eventsource';
import t, { type Test } from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { issueSandboxToken } from '../../gateway/src/services/credentials.ts';
import { changed } from '../../gateway/src/services/tenant-events.ts';
import { PASSWORD, signUp, startTestService, transportSetups } from './harness.ts';
import { frames, parseFrame, rawGet, type SseEvent } from './sse-client.ts';
import { eventually } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = (check: () => boolean | Promise<boolean>, ms = 5000) => eventually(check, ms);

/** The events (frames with data) a raw watcher has received so far. */
const eventsOf = (text: string): SseEvent[] =>
  frames(text)
    .map(parseFrame)
    .filter((e) => e.data !== undefined);
const messages = (text: string) =>
  eventsOf(text)
    .filter((e) => e.event === undefined)
    .map((e) => ({ id: Number(e.id), ...JSON.parse(e.data as string) }));

/**
 * The W3C `eventsource` client on `url` with a bearer key: `sent` records the Last-Event-ID of
 * each (re)connection (null on the first), `fired` the data of each message event.
 */
function watchWithEventSource(t: Test, url: string, key: string) {
  const sent: (string | null)[] = [];
  const es = new EventSource(url, {
    fetch: (input, init) => {
      const headers = new Headers(init?.headers as Record<string, string>);
      sent.push(headers.get('last-event-id'));
      headers.set('authorization', `Bearer ${key}`);
      return fetch(input, { ...init, headers });
    },
  });
  t.teardown(() => es.close());
  const fired: string[] = [];
  es.addEventListener('message', (m) => fired.push(m.data));
  return { es, sent, fired };
}

for (const { backend, edge } of transportSetups()) {
  t.test(
    `the multiplexed streams on ${backend}, ${edge ? 'through the edge' : 'api role alone (EDGE=false)'}`,
    async (t) => {
      const svc = await startTestService(t, {
        backend,
        env: { EDGE: String(edge), SSE_HEARTBEAT_MS: '100', SSE_IDLE_CLOSE_MS: '4000', LOG_COPY_INTERVAL_MS: '50' },
      });
      const { sql } = svc.db;
      const me = await signUp(svc);
      const other = await signUp(svc);
      const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
      const auth = { authorization: `Bearer ${me.key}` };
      const a = await createConversationRecord(sql, who, { agentId: 'agt_a', title: 'a' });
      const b = await createConversationRecord(sql, who, { agentId: 'agt_b', title: 'b' });
      const theirs = await createConversationRecord(
        sql,
        { accountId: other.accountId, actor: 'api', ip: null },
        { agentId: 'agt_z', title: 'z' },
      );
      const seqs = new Map<string, number>();
      const append = (tenant: string, conversationId: string, data: string, stream = 'stdout') => {
        const seq = (seqs.get(tenant) ?? 0) + 1;
        seqs.set(tenant, seq);
        return svc.appendEvents({
          tenant,
          producer: 'test',
          seq,
          events: [{ conversationId, kind: stream === 'stage' ? 'stage' : 'output', stream, data }],
        });
      };
      // Let the relay append the creations' `conversations` events before anyone watches.
      await sleep(300);

      t.test(
        '/api/events/stream follows every conversation, picks up new ones, and never shows another tenant',
        async (t) => {
          const w = rawGet(svc, '/api/events/stream', auth);
          t.teardown(() => w.sock.destroy());
          t.ok(await until(() => frames(w.text()).length >= 1));
          t.match(w.text(), /^HTTP\/1\.1 200 OK\r\n/);
          t.equal(frames(w.text())[0], ': connected', 'the first byte is the connected comment');
          await append(me.accountId, a.id, 'a-1');
          await append(other.accountId, theirs.id, 'not yours');
          await append(me.accountId, b.id, 'b-1');
          t.ok(await until(() => messages(w.text()).length >= 2));
          const c = await createConversationRecord(sql, who, { agentId: 'agt_c', title: 'c' });
          t.ok(await until(() => eventsOf(w.text()).some((e) => e.event === 'conversations')), 'told of the new one');
          await append(me.accountId, c.id, 'c-1');
          t.ok(await until(() => messages(w.text()).length >= 3));
          const got = messages(w.text());
          t.same(
            got.map((e) => [e.conversation_id, e.data]),
            [
              [a.id, 'a-1'],
              [b.id, 'b-1'],
              [c.id, 'c-1'],
            ],
            'each event with its conversation, in order; the new conversation followed on its own',
          );
          t.ok(
            got.every((e, i) => i === 0 || e.id > got[i - 1].id),
            'ids increase',
          );
          const conversationsEvent = eventsOf(w.text()).find((e) => e.event === 'conversations') as SseEvent;
          t.same(JSON.parse(conversationsEvent.data as string), { reason: 'changed' });
          t.notMatch(w.text(), /not yours/);
        },
      );

      t.test('`conversations` is sent at most once a second; a burst folds into one, ids never go back', async (t) => {
        const w = rawGet(svc, '/api/events/stream', auth);
        t.teardown(() => w.sock.destroy());
        await until(() => frames(w.text()).length >= 1);
        for (let i = 0; i < 6; i++) await svc.http.post(`/api/conversations/${a.id}/read`, { token: me.key });
        await append(me.accountId, a.id, 'between');
        t.ok(await until(() => eventsOf(w.text()).filter((e) => e.event === 'conversations').length >= 2, 4000));
        await sleep(1300);
        const all = eventsOf(w.text());
        const changes = all.filter((e) => e.event === 'conversations');
        t.equal(changes.length, 2, 'six changes inside a second: the first now, the rest as one a second later');
        const ids = all.map((e) => Number(e.id));
        t.ok(
          ids.every((id, i) => i === 0 || id >= (ids[i - 1] as number)),
          `the folded one carries the position, so the client's id never goes back (${ids.join(',')})`,
        );
      });

      t.test('Last-Event-ID replays across conversations, once each, in order; deleted ones stay gone', async (t) => {
        const events = (await svc.eventLog.read(me.accountId, { after: 0, limit: 1000 })).filter(
          (e) => e.conversationId !== null,
        );
        const from = events[0]?.id as number;
        const w = rawGet(svc, '/api/events/stream', { ...auth, 'last-event-id': String(from) });
        t.teardown(() => w.sock.destroy());
        const expected = events.slice(1).map((e) => [e.conversationId, e.data]);
        t.ok(await until(() => messages(w.text()).length >= expected.length));
        t.same(
          messages(w.text()).map((e) => [e.conversation_id, e.data]),
          expected,
          'every conversation event after the id',
        );
        t.ok(
          eventsOf(w.text()).some((e) => e.event === 'conversations'),
          'and the changes after it',
        );
        w.sock.destroy();

        t.equal((await svc.http.delete(`/api/conversations/${b.id}`, { token: me.key })).status, 204);
        const again = rawGet(svc, `/api/events/stream?last_event_id=${from - 1}`, auth);
        t.teardown(() => again.sock.destroy());
        t.ok(await until(() => messages(again.text()).length >= expected.length - 1));
        await sleep(200);
        t.same(
          messages(again.text()).map((e) => e.data),
          events.filter((e) => e.conversationId !== b.id).map((e) => e.data),
          "the deleted conversation's events are not replayed (query fallback last_event_id)",
        );
      });

      t.test('streams filters conversation events; a heartbeat then carries the position as a bare id', async (t) => {
        const w = rawGet(svc, '/api/events/stream?streams=stage', auth);
        t.teardown(() => w.sock.destroy());
        await until(() => frames(w.text()).length >= 1);
        await append(me.accountId, a.id, 'filtered out');
        const last = (await append(me.accountId, a.id, 'filtered out too')).events[0]?.id as number;
        t.ok(
          await until(() => w.text().includes(`: heartbeat\nid: ${last}\n\n`)),
          'the heartbeat says: you are at the last id',
        );
        await append(me.accountId, a.id, 'stage', 'stage');
        t.ok(await until(() => messages(w.text()).length === 1));
        t.equal(messages(w.text())[0].stream, 'stage');
      });

      t.test(
        'the eventsource client takes the bare id: it reconnects from there, and fires no event for it',
        async (t) => {
          // Its own node, closing idle streams quickly, so the client reconnects within the test.
          const quick = await startTestService(t, {
            backend,
            env: { EDGE: String(edge), SSE_HEARTBEAT_MS: '100', SSE_IDLE_CLOSE_MS: '700' },
          });
          const you = await signUp(quick);
          const conv = await createConversationRecord(
            quick.db.sql,
            { accountId: you.accountId, actor: 'api', ip: null },
            { agentId: 'agt_q', title: 'q' },
          );
          // The creation's `conversations` event first, so that only filtered events follow it.
          const relayed = async () =>
            (await quick.eventLog.read(you.accountId, { after: 0, limit: 10 })).some((e) => e.kind === 'conversations');
          t.ok(await until(relayed));
          const { es, sent, fired } = watchWithEventSource(t, `${quick.url}/api/events/stream?streams=stage`, you.key);
          t.ok(await until(() => es.readyState === EventSource.OPEN));
          let last = 0;
          for (let i = 0; i < 3; i++) {
            const r = await quick.appendEvents({
              tenant: you.accountId,
              producer: 'test',
              seq: i + 1,
              events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data: `filtered ${i}` }],
            });
            last = r.events[0]?.id as number;
          }
          t.ok(await until(() => sent.length >= 2, 10_000), 'the client reconnected after the idle close');
          t.equal(sent[1], String(last), 'with the position the heartbeat carried as its Last-Event-ID');
          t.same(fired, [], 'and no message fired for the filtered events or the heartbeat');
        },
      );

      t.test(
        'a watcher is told its position right after `: connected`, so a drop before its first event loses nothing',
        async (t) => {
          // A heartbeat (a comment, due at a random moment within this node's 100 ms) may come
          // before the id when subscribing takes longer than that on a loaded machine.
          const opening = (text: string) => frames(text).filter((f) => f !== ': heartbeat');
          for (const path of ['/api/events/stream', '/api/team/stream']) {
            const position = await svc.eventLog.lastId(me.accountId);
            const w = rawGet(svc, path, auth);
            t.ok(await until(() => opening(w.text()).length >= 2), path);
            t.same(opening(w.text()).slice(0, 2), [': connected', `id: ${position}`], `${path}: a bare id, no event`);
            w.sock.destroy();
          }
          // Away before any event: what happens meanwhile comes on resuming from the bare id.
          const w = rawGet(svc, '/api/events/stream', auth);
          await until(() => opening(w.text()).length >= 2);
          w.sock.destroy();
          const told = parseFrame(opening(w.text())[1] as string).id as string;
          await append(me.accountId, a.id, 'while away');
          const back = rawGet(svc, '/api/events/stream', { ...auth, 'last-event-id': told });
          t.teardown(() => back.sock.destroy());
          t.ok(await until(() => messages(back.text()).length >= 1), 'resumed from the bare id');
          t.same(
            messages(back.text()).map((e) => e.data),
            ['while away'],
            'what happened while it was away, and nothing else',
          );
        },
      );

      t.test(
        'the eventsource client takes the bare id of the opening: its first reconnect resumes from there',
        async (t) => {
          // Its own node, closing idle streams quickly, so the client reconnects within the test.
          const quick = await startTestService(t, {
            backend,
            env: { EDGE: String(edge), SSE_HEARTBEAT_MS: '60000', SSE_IDLE_CLOSE_MS: '700' },
          });
          const you = await signUp(quick);
          await createConversationRecord(
            quick.db.sql,
            { accountId: you.accountId, actor: 'api', ip: null },
            { agentId: 'agt_q', title: 'q' },
          );
          t.ok(await until(async () => (await quick.eventLog.lastId(you.accountId)) > 0), 'the creation was relayed');
          const position = await quick.eventLog.lastId(you.accountId);
          const { sent, fired } = watchWithEventSource(t, `${quick.url}/api/events/stream`, you.key);
          t.ok(await until(() => sent.length >= 2, 10_000), 'the client reconnected after the idle close');
          t.same(sent.slice(0, 2), [null, String(position)], 'with the opening position as its Last-Event-ID');
          t.same(fired, [], 'and no message fired for it');
        },
      );

      t.test('/api/team/stream: the team channel only, with agent_id; team and schedule changes', async (t) => {
        const mate = await createConversationRecord(sql, who, {
          agentId: 'agt_mate',
          title: 'mate',
          channelId: 'svc:team',
        });
        await sleep(200);
        const w = rawGet(svc, '/api/team/stream', auth);
        t.teardown(() => w.sock.destroy());
        await until(() => frames(w.text()).length >= 1);
        await append(me.accountId, a.id, 'not on the team');
        await append(me.accountId, mate.id, 'teammate says hi');
        await sql.begin((tx) => outbox.enqueue(tx as never, me.accountId, [changed('team')]));
        await sql.begin((tx) => outbox.enqueue(tx as never, me.accountId, [changed('schedule')]));
        await svc.http.post(`/api/conversations/${a.id}/read`, { token: me.key });
        t.ok(await until(() => eventsOf(w.text()).length >= 3));
        await sleep(300);
        const all = eventsOf(w.text());
        t.same(
          all.map((e) => e.event ?? 'message'),
          ['message', 'team', 'schedule'],
          'no other conversation, no conversations event',
        );
        t.match(JSON.parse(all[0]?.data as string), {
          conversation_id: mate.id,
          agent_id: 'agt_mate',
          data: 'teammate says hi',
        });
        t.same(JSON.parse(all[1]?.data as string), { reason: 'changed' });
      });

      t.test('an unknown stream name is 400 invalid_request before any byte of stream, on every stream', async (t) => {
        for (const path of [`/api/conversations/${a.id}/stream`, '/api/events/stream', '/api/team/stream']) {
          const res = await fetch(`${svc.url}${path}?streams=stdout,bogus`, { headers: auth });
          t.equal(res.status, 400, path);
          t.same(await res.json(), {
            error: 'invalid_request',
            message: 'streams is a list of stdout, stderr, stage, acp.',
          });
        }
        const all = rawGet(svc, '/api/events/stream?streams=', auth);
        t.teardown(() => all.sock.destroy());
        t.ok(await until(() => frames(all.text()).length >= 1));
        t.match(all.text(), /^HTTP\/1\.1 200 OK/, 'an empty list is every stream');
      });

      t.test(
        'sandbox tokens may not open the multiplexed streams; a session cookie may; no credential is 401',
        async (t) => {
          const sandbox = await issueSandboxToken(sql, me.accountId, a.id);
          for (const path of ['/api/events/stream', '/api/team/stream']) {
            const res = await fetch(`${svc.url}${path}`, { headers: { authorization: `Bearer ${sandbox.key}` } });
            t.equal(res.status, 403, path);
            t.equal(((await res.json()) as { error: string }).error, 'forbidden');
            const anon = await fetch(`${svc.url}${path}`);
            t.equal(anon.status, 401);
            t.equal(((await anon.json()) as { error: string }).error, 'unauthorized');
          }
          const login = await svc.http.post('/api/auth/login', { body: { email: me.email, password: PASSWORD } });
          const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0] as string;
          t.match(cookie, /^svc_session=/);
          for (const path of ['/api/events/stream', '/api/team/stream']) {
            const browser = rawGet(svc, path, { cookie });
            t.ok(await until(() => frames(browser.text()).length >= 1), `${path}: a browser session may watch`);
            t.match(browser.text(), /^HTTP\/1\.1 200 OK/);
            browser.sock.destroy();
          }
          // Spaces around the pair are tolerated by browsers and by the API; a stream reads the header alike.
          const spaced = `theme=dark;  svc_session = ${cookie.slice('svc_session='.length)} `;
          const api = await fetch(`${svc.url}/api/auth/me`, { headers: { cookie: spaced } });
          t.equal(api.status, 200, 'the API reads the spaced session');
          t.equal(((await api.json()) as { email: string }).email, me.email);
          const spacedStream = rawGet(svc, '/api/events/stream', { cookie: spaced });
          t.ok(await until(() => frames(spacedStream.text()).length >= 1), 'a stream reads it too');
          t.match(spacedStream.text(), /^HTTP\/1\.1 200 OK/);
          spacedStream.sock.destroy();
          const own = rawGet(svc, `/api/conversations/${a.id}/stream`, { authorization: `Bearer ${sandbox.key}` });
          await own.closed;
          t.match(own.text(), /^HTTP\/1\.1 200 OK/, 'its own conversation stream it may');
        },
      );
    },
  );
}
