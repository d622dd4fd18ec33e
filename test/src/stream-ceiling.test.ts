/**
 * Fair shares: an account holds at most SSE_MAX_STREAMS_PER_ACCOUNT open event streams on a
 * node; one more is 429 `rate_limited` with Retry-After, and a place comes back when a stream
 * closes. Another account is not touched by it.
 */
import t, { type Test } from 'tap';
import { signUp, startTestService, type TestService } from './harness.ts';
import { frames, rawGet } from './sse-client.ts';
import { until } from './until.ts';

const MAX = 3;

function open(t: Test, svc: TestService, key: string, path: string) {
  const w = rawGet(svc, path, { authorization: `Bearer ${key}` });
  t.teardown(() => w.sock.destroy());
  return w;
}

for (const edge of [true, false]) {
  t.test(`an account's open streams have a ceiling per node (${edge ? 'edge' : 'api role alone'})`, async (t) => {
    const svc = await startTestService(t, {
      backend: 'embedded',
      env: { EDGE: String(edge), SSE_MAX_STREAMS_PER_ACCOUNT: String(MAX), SSE_IDLE_CLOSE_MS: '0' },
    });
    const me = await signUp(svc);
    const other = await signUp(svc);
    const held = [];
    for (let i = 0; i < MAX; i++) {
      // Team and tenant streams count alike: they are all this node's watchers.
      const w = open(t, svc, me.key, i % 2 ? '/api/team/stream' : '/api/events/stream');
      await until(`stream ${i} to open`, () => frames(w.text()).length > 0);
      held.push(w);
    }
    const refused = open(t, svc, me.key, '/api/events/stream');
    await refused.closed;
    const head = refused.text().split('\r\n\r\n')[0] ?? '';
    t.match(head, /^HTTP\/1\.1 429/, 'one more is 429');
    t.match(head, /\r\nretry-after: 10\r\n/i, 'with Retry-After');
    const body = refused.text().slice(refused.text().indexOf('{'), refused.text().lastIndexOf('}') + 1);
    t.match(JSON.parse(body), {
      error: 'rate_limited',
      limit: MAX,
      message: /3 event streams open on this node.*SSE_MAX_STREAMS_PER_ACCOUNT/,
    });

    const theirs = open(t, svc, other.key, '/api/events/stream');
    t.ok(
      await until('another account’s stream to open', () => frames(theirs.text()).length > 0),
      'another account is not touched',
    );

    held[0]?.sock.destroy();
    const again = await until('a place to come back once a stream closed', async () => {
      const w = open(t, svc, me.key, '/api/events/stream');
      const answered = await until('an answer', () => (w.text().length > 0 ? w.text() : undefined));
      if (answered.startsWith('HTTP/1.1 200')) return w;
      w.sock.destroy();
      return undefined;
    });
    t.ok(await until('it to stream', () => frames(again.text()).length > 0), 'the next one opens');
  });
}
