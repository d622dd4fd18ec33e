import { EventSource } from 'eventsource';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { signUp, startTestService } from './harness.ts';
import { rawGet } from './sse-client.ts';
import { eventually } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const ADMIN = 'ops@multinode.example.test';

t.test(
  'two edge nodes on one Redis and one Postgres',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis' },
  async (t) => {
    const a = await startTestService(t, { backend: 'postgres+redis', env: { ADMIN_EMAILS: ADMIN } });
    const b = await startTestService(t, {
      backend: 'postgres+redis',
      env: {
        DATABASE_URL: a.config.DATABASE_URL as string,
        REDIS_KEY_PREFIX: a.config.REDIS_KEY_PREFIX,
        MASTER_KEY: a.config.MASTER_KEY as string,
      },
    });
    const me = await signUp(a);
    const conv = await createConversationRecord(
      a.db.sql,
      { accountId: me.accountId, actor: 'api', ip: null },
      { agentId: 'agt_x' },
    );
    await a.appendEvents({
      tenant: me.accountId,
      producer: 'runner-a',
      seq: 1,
      events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data: 'before' }],
    });

    t.test('a watcher on node B sees what node A appends, in order, after the history', async (t) => {
      const seen: { id: number; data: string }[] = [];
      const es = new EventSource(`${b.url}/api/conversations/${conv.id}/stream?wait=true`, {
        fetch: (input, init) =>
          fetch(input, { ...init, headers: { ...(init?.headers ?? {}), authorization: `Bearer ${me.key}` } }),
      });
      t.teardown(() => es.close());
      es.addEventListener('message', (m) => seen.push({ id: Number(m.lastEventId), data: JSON.parse(m.data).data }));
      await sleep(300);
      for (let i = 0; i < 50; i++) {
        await a.appendEvents({
          tenant: me.accountId,
          producer: 'runner-a',
          seq: 2 + i,
          events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data: `live ${i}` }],
        });
      }
      for (let i = 0; i < 50 && seen.length < 51; i++) await sleep(50);
      t.same(
        seen.map((s) => s.data),
        ['before', ...Array.from({ length: 50 }, (_, i) => `live ${i}`)],
      );
      t.ok(
        seen.every((s, i) => i === 0 || s.id > (seen[i - 1] as { id: number }).id),
        'ids increase',
      );
    });

    t.test("node B's JSON feed and node A's agree", async (t) => {
      const fromA = await a.http.get(`/api/conversations/${conv.id}/events?limit=1000`, { token: me.key });
      const fromB = await b.http.get(`/api/conversations/${conv.id}/events?limit=1000`, { token: me.key });
      t.equal(fromA.body.data.length, 51);
      t.same(fromB.body.data, fromA.body.data);
    });

    t.test('a key made through node A works on node B', async (t) => {
      const me2 = await b.http.get('/api/auth/me', { token: me.key });
      t.equal(me2.body.id, me.accountId);
    });

    t.test('an account suspended through node A: its stream on node B ends, another stays', async (t) => {
      const op = await signUp(a, ADMIN);
      const other = await signUp(a);
      const open = (key: string) => {
        const s = rawGet(b, '/api/events/stream', { authorization: `Bearer ${key}` });
        t.teardown(() => s.sock.destroy());
        let ended = false;
        void s.closed.then(() => {
          ended = true;
        });
        return { ...s, ended: () => ended };
      };
      const mine = open(me.key);
      const theirs = open(other.key);
      t.ok(
        await eventually(() => mine.text().includes(': connected') && theirs.text().includes(': connected'), 10_000),
        'both streams opened on node B',
      );
      const res = await a.http.post(`/api/admin/users/${me.accountId}/suspend`, {
        token: op.key,
        body: { suspended: true },
      });
      t.equal(res.status, 200, res.text);
      t.ok(await eventually(mine.ended, 10_000), 'node B ended the suspended account’s stream');
      t.notOk(theirs.ended(), 'and kept the other account’s');
      const again = await b.http.get('/api/events/stream', { token: me.key });
      t.equal(again.status, 403);
      t.equal(again.body.error, 'account_suspended');
    });
  },
);
