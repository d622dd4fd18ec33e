/**
 * Errors that tell the user what to fix: a body sent as a form or another media type, bytes
 * that are not UTF-8, a webhook URL the instance refuses, a Last-Event-ID that is not an id, a
 * path outside the docs' files, and a client that hangs up mid-body. Each is a clear 4xx in
 * `{error, message}`, changes nothing, and logs nothing at error level.
 */
import { connect } from 'node:net';
import { Writable } from 'node:stream';
import pino from 'pino';
import t from 'tap';
import { signUp, startTestService, type TestService } from './harness.ts';
import { dechunked } from './sse-client.ts';
import { until } from './until.ts';

/** Every line the service logs, parsed. */
function capturedLog() {
  const lines: { level: number; msg: string; [k: string]: unknown }[] = [];
  const sink = new Writable({
    write(chunk, _enc, done) {
      for (const line of chunk.toString().split('\n')) if (line) lines.push(JSON.parse(line));
      done();
    },
  });
  return { lines, log: pino({ level: 'info' }, sink) };
}

/** One raw HTTP/1.1 exchange: the request's bytes as given (no normalisation), the whole answer. */
function raw(svc: TestService, request: string | Buffer): Promise<{ status: number; head: string; body: string }> {
  const url = new URL(svc.url);
  return new Promise((resolve, reject) => {
    const sock = connect(Number(url.port), url.hostname);
    let got = '';
    // A char per byte, so chunk sizes line up with string offsets; the body is UTF-8 decoded last.
    sock.on('data', (d: Buffer) => {
      got += d.toString('latin1');
    });
    sock.on('error', reject);
    sock.on('close', () => {
      const at = got.indexOf('\r\n\r\n');
      const head = at < 0 ? got : got.slice(0, at);
      let body = at < 0 ? '' : got.slice(at + 4);
      if (/^transfer-encoding: chunked/im.test(head)) body = dechunked(body);
      resolve({ status: Number(head.split(' ')[1]), head, body: Buffer.from(body, 'latin1').toString('utf8') });
    });
    sock.write(request);
  });
}

for (const edge of [true, false]) {
  t.test(`errors say what to fix (${edge ? 'through the edge' : 'api role alone'})`, async (t) => {
    const { lines, log } = capturedLog();
    const svc = await startTestService(t, { backend: 'embedded', env: { EDGE: String(edge) }, log });
    const { key: token } = await signUp(svc);
    const host = new URL(svc.url).host;
    const environments = async () =>
      ((await svc.http.get('/api/environments', { token })).body.data as { name: string }[]).map((e) => e.name);
    const post = (type: string | undefined, body: Buffer | string) =>
      raw(
        svc,
        Buffer.concat([
          Buffer.from(
            `POST /api/environments HTTP/1.1\r\nhost: ${host}\r\nauthorization: Bearer ${token}\r\nconnection: close\r\n` +
              `${type ? `content-type: ${type}\r\n` : ''}content-length: ${Buffer.byteLength(body)}\r\n\r\n`,
          ),
          Buffer.from(body),
        ]),
      );

    t.test('a JSON text sent as a form (curl -d) is 400 saying it was not read as JSON, and why', async (t) => {
      const res = await post('application/x-www-form-urlencoded', '{"name":"x"}');
      t.equal(res.status, 400, res.body);
      t.match(JSON.parse(res.body), {
        error: 'invalid_request',
        message:
          /sent as a form.*application\/x-www-form-urlencoded.*not read as JSON.*Content-Type: application\/json/,
      });
      t.same(await environments(), [], 'nothing was made');
    });

    t.test('another media type is 400 naming it', async (t) => {
      const res = await post('text/plain', '{"name":"x"}');
      t.equal(res.status, 400, res.body);
      t.match(JSON.parse(res.body), { error: 'invalid_request', message: /not text\/plain.*application\/json/ });
      t.same(await environments(), []);
    });

    t.test('bytes that are not UTF-8 are 400, not stored with replacement characters', async (t) => {
      const body = Buffer.concat([Buffer.from('{"name":"caf'), Buffer.from([0xe9]), Buffer.from('"}')]);
      const res = await post('application/json', body);
      t.equal(res.status, 400, res.body);
      t.match(JSON.parse(res.body), { error: 'invalid_request', message: /not valid UTF-8/ });
      t.same(await environments(), []);
      const fine = await post('application/json', JSON.stringify({ name: 'café' }));
      t.equal(fine.status, 201, 'UTF-8 itself is taken');
      t.same(await environments(), ['café']);
    });

    t.test('a refused webhook URL names the setting that would allow it', async (t) => {
      const plain = await svc.http.post('/api/webhooks', { token, body: { url: 'http://hooks.example.com/' } });
      t.equal(plain.status, 422);
      t.match(plain.body.details.url, [/https:\/\/.*WEBHOOK_ALLOW_HTTP/]);
      const inside = await svc.http.post('/api/webhooks', { token, body: { url: 'https://10.1.2.3/hook' } });
      t.equal(inside.status, 422);
      t.match(inside.body.details.url, [/WEBHOOK_ALLOW_CIDRS/]);
    });

    t.test('a Last-Event-ID that is not an event id is 400, at once', async (t) => {
      for (const id of ['x'.repeat(8000), 'abc', '12a', '99999999999999999999']) {
        const res = await raw(
          svc,
          `GET /api/events/stream HTTP/1.1\r\nhost: ${host}\r\nauthorization: Bearer ${token}\r\nlast-event-id: ${id}\r\nconnection: close\r\n\r\n`,
        );
        t.equal(res.status, 400, `${id.slice(0, 20)}: ${res.body.slice(0, 200)}`);
        const body = JSON.parse(res.body);
        t.match(body, { error: 'invalid_request', message: /Last-Event-ID must be the id of an event/ });
        t.ok(body.message.length < 200, 'and the id is not echoed back whole');
      }
    });

    t.test('a path that climbs out of the docs files is 404, logged as no error', async (t) => {
      const res = await raw(
        svc,
        `GET /api/docs/static/../../../../etc/passwd HTTP/1.1\r\nhost: ${host}\r\nconnection: close\r\n\r\n`,
      );
      t.equal(res.status, 404, res.body);
      t.equal(JSON.parse(res.body).error, 'not_found');
      t.notMatch(res.body, /root:/);
    });

    t.test('a client that hangs up mid-body is logged at info, not as an error', async (t) => {
      const url = new URL(svc.url);
      const sock = connect(Number(url.port), url.hostname);
      await new Promise((resolve) => sock.once('connect', resolve));
      sock.write(
        `POST /api/environments HTTP/1.1\r\nhost: ${host}\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"name":`,
      );
      await new Promise((r) => setTimeout(r, 300));
      sock.destroy();
      await until('the cut-off request to be logged', () =>
        lines.find((l) => l.msg === 'the client left before its request was read'),
      );
      t.same(await environments(), ['café'], 'nothing more was made');
    });

    t.test(
      'requests that are not HTTP/1.1 as RFC 9112 says get a 400 with a body, at once (api role alone)',
      { skip: edge && 'the edge’s uWebSockets.js closes these without an answer (README)' },
      async (t) => {
        const malformed = {
          'a header line without a colon': `GET /api/health HTTP/1.1\r\nhost: ${host}\r\nX-Bad\r\nKey: v\r\n\r\n`,
          'a bare LF': `GET /api/health HTTP/1.1\nhost: ${host}\n\n`,
          'no Host': 'GET /api/health HTTP/1.1\r\n\r\n',
          'two different lengths': `POST /api/health HTTP/1.1\r\nhost: ${host}\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab`,
          'HTTP/1.2': `GET /api/health HTTP/1.2\r\nhost: ${host}\r\n\r\n`,
        };
        for (const [what, request] of Object.entries(malformed)) {
          const res = await raw(svc, request);
          t.equal(res.status, 400, `${what}: ${res.head.split('\r\n')[0]}`);
          t.match(JSON.parse(res.body || '{}'), { error: 'invalid_request', message: /not HTTP\/1\.1/ }, what);
        }
        const old = await raw(svc, 'GET /api/health HTTP/1.0\r\n\r\n');
        t.equal(old.status, 200, 'HTTP/1.0 is answered');
      },
    );

    t.test('nothing here was logged at error level', async (t) => {
      t.same(
        lines.filter((l) => l.level >= 50).map((l) => l.msg),
        [],
      );
    });
  });
}
