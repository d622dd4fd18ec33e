import { execFileSync } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { EventSource } from 'eventsource';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { signUp, startTestService } from './harness.ts';
import { haveRedis, ownRedisServer } from './own-redis.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

for (const keepData of [true, false]) {
  t.test(
    `Redis restarted mid-stream, ${keepData ? 'keeping' : 'losing'} its data`,
    { skip: !haveRedis() && 'no redis-server' },
    async (t) => {
      const redis = await ownRedisServer(t, 'redis-restart');
      const { port, dir } = redis;
      const svc = await startTestService(t, {
        backend: 'postgres+redis',
        env: { REDIS_URL: `redis://127.0.0.1:${port}`, SSE_IDLE_CLOSE_MS: '0', LOG_COPY_INTERVAL_MS: '50' },
      });
      const me = await signUp(svc);
      const conv = await createConversationRecord(
        svc.db.sql,
        { accountId: me.accountId, actor: 'api', ip: null },
        { agentId: 'agt_x' },
      );
      let seq = 0;
      const append = async (data: string) => {
        // A producer resends until the log has it (its mark makes a resend harmless).
        const mine = ++seq;
        for (;;) {
          try {
            const r = await svc.appendEvents({
              tenant: me.accountId,
              producer: 'runner',
              seq: mine,
              events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data }],
            });
            if (r.status !== 'gap') return;
            // The store lost the producer's mark: it starts again from this number.
          } catch {
            await sleep(100);
          }
        }
      };

      const seen: { id: number; data: string }[] = [];
      const es = new EventSource(`${svc.url}/api/conversations/${conv.id}/stream?wait=true`, {
        fetch: (input, init) =>
          fetch(input, { ...init, headers: { ...(init?.headers ?? {}), authorization: `Bearer ${me.key}` } }),
      });
      t.teardown(() => es.close());
      es.addEventListener('message', (m) => seen.push({ id: Number(m.lastEventId), data: JSON.parse(m.data).data }));
      await sleep(300);
      for (let i = 0; i < 10; i++) await append(`before ${i}`);
      await sleep(300); // let the copier take them into Postgres
      const highBefore = Math.max(...seen.map((s) => s.id));

      // Keeping: a clean shutdown, then the same directory (appendonly, fsync always). Losing: a
      // kill, then an empty directory, as a replacement server would start.
      await redis.stop(keepData ? 'SIGTERM' : 'SIGKILL');
      if (!keepData) rmSync(join(dir, 'appendonlydir'), { recursive: true, force: true });
      await redis.start();
      const keys = Number(
        execFileSync('redis-cli', ['-p', String(port), 'dbsize'])
          .toString()
          .trim(),
      );
      if (keepData) t.ok(keys > 0, `the restarted server kept its ${keys} keys`);
      else t.equal(keys, 0, 'the restarted server is empty');
      for (let i = 0; i < 10; i++) await append(`after ${i}`);
      for (let i = 0; i < 100 && seen.filter((s) => s.data.startsWith('after')).length < 10; i++) await sleep(50);

      const datas = seen.map((s) => s.data);
      t.same(
        datas.filter((d) => d.startsWith('before')),
        Array.from({ length: 10 }, (_, i) => `before ${i}`),
        'nothing before the restart lost or doubled',
      );
      t.same(
        datas.filter((d) => d.startsWith('after')),
        Array.from({ length: 10 }, (_, i) => `after ${i}`),
        'everything after it arrives once, in order',
      );
      const afterIds = seen.filter((s) => s.data.startsWith('after')).map((s) => s.id);
      t.ok(
        afterIds.every((id) => id > highBefore),
        'ids never went back',
      );
      const feed = await svc.http.get(`/api/conversations/${conv.id}/events?limit=1000`, { token: me.key });
      t.same(
        feed.body.data.map((e: { data: string }) => e.data),
        [...Array.from({ length: 10 }, (_, i) => `before ${i}`), ...Array.from({ length: 10 }, (_, i) => `after ${i}`)],
        'the JSON feed has each event once (Postgres below, Redis above)',
      );
    },
  );
}
