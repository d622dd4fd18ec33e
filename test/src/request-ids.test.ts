/**
 * Request ids and request logging: every response carries X-Request-Id (the client's when it
 * is usable, else a new one), and the request's log line carries the same id with the method,
 * the route pattern (never the raw URL, whose query may hold a token), the status and the time.
 * On both servers: the edge in front of the api role, and the api role alone (EDGE=false).
 */
import { Writable } from 'node:stream';
import pino from 'pino';
import t, { type Test } from 'tap';
import { signUp, startTestService } from './harness.ts';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Line {
  msg: string;
  reqId?: string;
  method?: string;
  route?: string | null;
  path?: string;
  status?: number;
  ms?: number;
  [k: string]: unknown;
}

async function serviceWithLog(t: Test, env: Record<string, string>) {
  let raw = '';
  const sink = new Writable({
    write(chunk, _enc, done) {
      raw += chunk.toString();
      done();
    },
  });
  const svc = await startTestService(t, { backend: 'embedded', env, log: pino({ level: 'info' }, sink) });
  const lines = () =>
    raw
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Line);
  /** The request line of `id`, waiting briefly: it is written once the response has gone. */
  const requestLine = async (id: string) => {
    for (let i = 0; i < 100; i++) {
      const found = lines().filter((l) => l.reqId === id && l.msg === 'request');
      if (found.length) return found;
      await sleep(20);
    }
    return [];
  };
  return { svc, raw: () => raw, requestLine };
}

for (const edge of [true, false]) {
  t.test(`request ids and request lines (EDGE=${edge})`, async (t) => {
    const { svc, raw, requestLine } = await serviceWithLog(t, { EDGE: String(edge) });
    const me = await signUp(svc);

    t.test("the client's X-Request-Id is echoed and names the request's log line", async (t) => {
      const res = await fetch(`${svc.url}/api/auth/me`, {
        headers: { authorization: `Bearer ${me.key}`, 'x-request-id': 'lb-7f3a.01:x_y' },
      });
      t.equal(res.status, 200);
      t.equal(res.headers.get('x-request-id'), 'lb-7f3a.01:x_y');
      const [line, ...more] = await requestLine('lb-7f3a.01:x_y');
      t.same(more, [], 'one line per request');
      t.match(line, { method: 'GET', route: '/api/auth/me', status: 200, ms: Number });
    });

    t.test('without one, or with one that is not usable, the service makes one', async (t) => {
      for (const sent of [undefined, 'has spaces', 'x'.repeat(129), 'quote"d']) {
        const res = await fetch(`${svc.url}/api/auth/me`, { headers: sent ? { 'x-request-id': sent } : {} });
        t.equal(res.status, 401);
        const id = res.headers.get('x-request-id') as string;
        t.match(id, UUID, `made for ${JSON.stringify(sent?.slice(0, 12))}`);
        t.match((await requestLine(id))[0], { method: 'GET', route: '/api/auth/me', status: 401 });
      }
    });

    t.test('the line has the route pattern, never the query: a token there stays out of the log', async (t) => {
      const res = await fetch(`${svc.url}/api/conversations/cnv_nothere?token=tok-abcdef-secret-in-query`, {
        headers: { authorization: `Bearer ${me.key}`, 'x-request-id': 'with-query' },
      });
      t.equal(res.status, 404);
      t.equal(res.headers.get('x-request-id'), 'with-query');
      t.match((await requestLine('with-query'))[0], { route: '/api/conversations/:id', status: 404 });
      t.notMatch(raw(), 'tok-abcdef-secret-in-query');
      t.notMatch(raw(), 'cnv_nothere');
    });

    t.test('an unknown route and an error answer carry the id too', async (t) => {
      const none = await fetch(`${svc.url}/api/no/such/route`, { headers: { 'x-request-id': 'no-route' } });
      t.equal(none.status, 404);
      t.equal(none.headers.get('x-request-id'), 'no-route');
      t.match((await requestLine('no-route'))[0], { method: 'GET', route: null, status: 404 });
      const bad = await fetch(`${svc.url}/api/auth/register`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-request-id': 'bad-body' },
        body: '{not json',
      });
      t.equal(bad.status, 400);
      t.equal(bad.headers.get('x-request-id'), 'bad-body');
      t.match(await bad.json(), { error: 'invalid_request', message: String });
      t.match((await requestLine('bad-body'))[0], { method: 'POST', route: '/api/auth/register', status: 400 });
    });

    t.test('a stream carries the id, and is logged when it ends', async (t) => {
      const refused = await fetch(`${svc.url}/api/events/stream`, { headers: { 'x-request-id': 'stream-401' } });
      t.equal(refused.status, 401);
      t.equal(refused.headers.get('x-request-id'), 'stream-401');
      t.match((await requestLine('stream-401'))[0], { route: '/api/events/stream', status: 401 });
      const ac = new AbortController();
      const open = await fetch(`${svc.url}/api/events/stream`, {
        headers: { authorization: `Bearer ${me.key}`, 'x-request-id': 'stream-200' },
        signal: ac.signal,
      });
      t.equal(open.status, 200);
      t.equal(open.headers.get('x-request-id'), 'stream-200');
      ac.abort();
      t.match((await requestLine('stream-200'))[0], { route: '/api/events/stream', status: 200 });
    });
  });

  t.test(`what the edge or the limiter refuses carries the id (EDGE=${edge})`, async (t) => {
    const { svc, requestLine } = await serviceWithLog(t, {
      EDGE: String(edge),
      RATE_LIMIT_PER_MINUTE: '2',
      BODY_LIMIT_BYTES: '2048',
    });
    const big = await fetch(`${svc.url}/api/auth/register`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'too-big' },
      body: JSON.stringify({ pad: 'x'.repeat(5000) }),
    });
    t.equal(big.status, 413);
    t.equal(big.headers.get('x-request-id'), 'too-big');
    t.match((await requestLine('too-big'))[0], { method: 'POST', status: 413 });
    let limited: Response | undefined;
    for (let i = 0; i < 5 && limited?.status !== 429; i++) {
      limited = await fetch(`${svc.url}/api/auth/me`, { headers: { 'x-request-id': `try-${i}` } });
    }
    t.equal(limited?.status, 429);
    const id = limited?.headers.get('x-request-id') as string;
    t.match(id, /^try-\d$/);
    t.match((await requestLine(id))[0], { method: 'GET', status: 429 });
  });
}
