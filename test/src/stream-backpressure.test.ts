import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { signUp, startTestService, transportSetups } from './harness.ts';
import { frames, rawGet } from './sse-client.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A replay of one page (under 1000 events) far larger than the socket's buffers, written while
 * the client does not read; then the client reads. Nothing else is ever written to the watcher
 * (no heartbeat within the test, no idle close), so every byte must go out on its own.
 */
for (const { backend, edge } of transportSetups()) {
  t.test(
    `a replay that outgrew the socket while the client paused arrives whole once it reads, on ${backend}, ${edge ? 'through the edge' : 'api role alone (EDGE=false)'}`,
    async (t) => {
      const svc = await startTestService(t, {
        backend,
        env: { EDGE: String(edge), SSE_HEARTBEAT_MS: '3600000', SSE_IDLE_CLOSE_MS: '0' },
      });
      const me = await signUp(svc);
      const conv = await createConversationRecord(
        svc.db.sql,
        { accountId: me.accountId, actor: 'api', ip: null },
        { agentId: 'agt_slow', title: 'slow reader' },
      );
      const count = 500;
      const big = 'y'.repeat(16 * 1024);
      let last = 0;
      for (let seq = 1; seq <= count; seq++) {
        const r = await svc.appendEvents({
          tenant: me.accountId,
          producer: 'slow',
          seq,
          events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data: `${seq} ${big}` }],
        });
        last = r.events.at(-1)?.id ?? last;
      }
      for (const path of [`/api/conversations/${conv.id}/stream?wait=true`, '/api/events/stream']) {
        t.test(path, async (t) => {
          const w = rawGet(svc, path, { authorization: `Bearer ${me.key}`, 'last-event-id': '1' }, { paused: true });
          t.teardown(() => w.sock.destroy());
          await sleep(500);
          w.sock.resume();
          const ids = () =>
            frames(w.text())
              // Events of the conversation: not the bare id, nor the `conversations` change its creation made.
              .filter((f) => f.startsWith('id: ') && f.includes('\ndata: ') && !f.includes('\nevent: '))
              .map((f) => Number(/^id: (\d+)/.exec(f)?.[1]));
          for (let waited = 0; ids().length < count && waited < 10_000; waited += 50) await sleep(50);
          t.equal(ids().length, count, 'every event of the replay arrived');
          t.equal(ids().at(-1), last, 'up to the last one');
          t.notMatch(w.text(), /^0\r\n\r\n/m, 'on a stream still open');
        });
      }
    },
  );
}
