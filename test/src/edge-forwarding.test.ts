/**
 * The edge in front of an upstream we control, a `node:http` request listener it hands each
 * request to in-process (as it hands them to Fastify): bodies stream both ways with
 * backpressure, the client address is passed on and cannot be forged, and status, headers and
 * errors come back as the upstream sent them.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import { createLogger } from '@svc/gateway';
import t, { type Test } from 'tap';
import { startEdge } from '../../gateway/src/edge/edge.ts';
import { createForwarder } from '../../gateway/src/edge/forward.ts';
import { settlesWithin, until } from './until.ts';

const MB = 1024 * 1024;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Upstream {
  handler: (req: IncomingMessage, res: ServerResponse) => void;
}

async function setup(t: Test, bodyLimit?: number) {
  const upstream: Upstream = { handler: (_q, s) => s.end('unset') };
  const log = createLogger('silent');
  const forwarder = createForwarder((q, s) => upstream.handler(q, s), log, bodyLimit);
  const edge = await startEdge({ host: '127.0.0.1', port: 0, limiter: undefined, rateLimitExempt: [], forwarder, log });
  t.teardown(() => edge.close(100));
  return { upstream, port: edge.port, forwarder };
}

/** A raw HTTP/1.1 client, so the test controls exactly when bytes are written and read. */
function rawClient(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

t.test('a large upload streams through with backpressure and arrives intact', async (t) => {
  const { upstream, port } = await setup(t);
  const total = 64 * MB;
  let received = 0;
  const hash = createHash('sha256');
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  upstream.handler = (req, res) => {
    req.pause();
    void released.then(() => {
      req.on('data', (c: Buffer) => {
        received += c.length;
        hash.update(c);
      });
      req.on('end', () => res.end(JSON.stringify({ received, sha256: hash.digest('hex') })));
      req.resume();
    });
  };

  const sock = await rawClient(port);
  const chunk = randomBytes(MB);
  const expected = createHash('sha256');
  sock.write(
    `POST /api/upload HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\ncontent-length: ${total}\r\n\r\n`,
  );
  let written = 0;
  let response = '';
  sock.on('data', (d) => {
    response += d.toString();
  });
  const writeAll = (async () => {
    while (written < total) {
      expected.update(chunk);
      written += chunk.length;
      if (!sock.write(chunk)) await new Promise((r) => sock.once('drain', r));
    }
  })();
  await sleep(1500);
  t.ok(
    written < total / 2,
    `while the api does not read, the client could write only ${written / MB} MB of ${total / MB}`,
  );
  release();
  await writeAll;
  for (let i = 0; i < 200 && !response.includes('sha256'); i++) await sleep(50);
  const body = JSON.parse(response.slice(response.indexOf('\r\n\r\n') + 4));
  t.equal(body.received, total, 'every byte arrived');
  t.equal(body.sha256, expected.digest('hex'), 'in order, unchanged');
  sock.destroy();
});

for (const framing of ['content-length', 'chunked'] as const) {
  t.test(`a large download (${framing}) waits for a slow client and arrives intact`, async (t) => {
    const { upstream, port } = await setup(t);
    const total = 64 * MB;
    const chunk = randomBytes(MB);
    let produced = 0;
    const expected = createHash('sha256');
    for (let i = 0; i < total / MB; i++) expected.update(chunk);
    upstream.handler = (_req, res) => {
      res.writeHead(200, {
        'content-type': 'application/octet-stream',
        ...(framing === 'content-length' ? { 'content-length': String(total) } : {}),
      });
      const pump = () => {
        while (produced < total) {
          produced += chunk.length;
          if (!res.write(chunk)) return res.once('drain', pump);
        }
        res.end();
      };
      pump();
    };

    const sock = await rawClient(port);
    sock.pause();
    sock.write('GET /download HTTP/1.1\r\nhost: x\r\n\r\n');
    await sleep(1500);
    t.ok(
      produced < total / 2,
      `while the client does not read, the api produced only ${produced / MB} MB of ${total / MB}`,
    );

    const got = createHash('sha256');
    const parts: Buffer[] = [];
    let received = 0;
    let headLength = Number.POSITIVE_INFINITY;
    await new Promise<void>((resolve) => {
      sock.on('data', (d: Buffer) => {
        parts.push(d);
        received += d.length;
        if (headLength === Number.POSITIVE_INFINITY) {
          const end = Buffer.concat(parts).indexOf('\r\n\r\n');
          if (end >= 0) headLength = end + 4;
        }
        // The whole body has arrived (content-length), or the last chunk was seen (chunked).
        if (framing === 'content-length' ? received >= headLength + total : d.subarray(-5).toString() === '0\r\n\r\n') {
          resolve();
        }
      });
      sock.resume();
    });
    const all = Buffer.concat(parts);
    const at = all.indexOf('\r\n\r\n');
    const head = all.subarray(0, at).toString();
    const rest = all.subarray(at + 4);
    let bodyBytes = 0;
    if (framing === 'chunked') {
      let i = 0;
      while (i < rest.length) {
        const eol = rest.indexOf('\r\n', i);
        const size = Number.parseInt(rest.subarray(i, eol).toString(), 16);
        if (size === 0) break;
        got.update(rest.subarray(eol + 2, eol + 2 + size));
        bodyBytes += size;
        i = eol + 2 + size + 2;
      }
      t.match(head, /transfer-encoding: chunked/i);
    } else {
      got.update(rest);
      bodyBytes = rest.length;
      t.match(head, new RegExp(`content-length: ${total}`, 'i'));
    }
    t.equal(bodyBytes, total, 'every byte arrived');
    t.equal(got.digest('hex'), expected.digest('hex'), 'in order, unchanged');
    sock.destroy();
  });
}

t.test('the client address is passed on and a forged one is overwritten', async (t) => {
  const { upstream, port } = await setup(t);
  upstream.handler = (req, res) => {
    res.setHeader('content-type', 'application/json');
    res.end(
      JSON.stringify({ ip: req.headers['x-svc-client-ip'], host: req.headers.host, conn: req.headers.connection }),
    );
  };
  const res = await fetch(`http://127.0.0.1:${port}/api/whoami`, { headers: { 'x-svc-client-ip': '6.6.6.6' } });
  const body = (await res.json()) as { ip: string };
  t.equal(body.ip, '127.0.0.1');
});

t.test('status, repeated headers, HEAD and 204 come back as the api sent them', async (t) => {
  const { upstream, port } = await setup(t);
  upstream.handler = (req, res) => {
    if (req.url === '/none') {
      res.writeHead(204);
      return res.end();
    }
    res.writeHead(418, [
      ['set-cookie', 'a=1'],
      ['set-cookie', 'b=2'],
      ['x-thing', 'yes'],
      ['content-type', 'text/plain'],
      ['content-length', '5'],
    ]);
    res.end(req.method === 'HEAD' ? undefined : 'hello');
  };
  const res = await fetch(`http://127.0.0.1:${port}/x`);
  t.equal(res.status, 418);
  t.same(res.headers.getSetCookie(), ['a=1', 'b=2']);
  t.equal(res.headers.get('x-thing'), 'yes');
  t.equal(await res.text(), 'hello');
  const head = await fetch(`http://127.0.0.1:${port}/x`, { method: 'HEAD' });
  t.equal(head.status, 418);
  t.equal(head.headers.get('content-length'), '5');
  const none = await fetch(`http://127.0.0.1:${port}/none`, { method: 'DELETE' });
  t.equal(none.status, 204);
  t.equal(await none.text(), '');
});

t.test('on one kept-alive connection, HEAD and 204 answers leave the next request answered', async (t) => {
  const { upstream, port } = await setup(t);
  upstream.handler = (req, res) => {
    if (req.url === '/none') {
      res.writeHead(204);
      return res.end();
    }
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '5' });
    res.end(req.method === 'HEAD' ? undefined : 'hello');
  };
  const sock = await rawClient(port);
  let got = '';
  sock.on('data', (d) => {
    got += d.toString();
  });
  const answers = () => got.split(/(?=HTTP\/1\.1 )/);
  for (const [i, request] of ['HEAD /x', 'DELETE /none', 'GET /x', 'HEAD /x', 'GET /x'].entries()) {
    sock.write(`${request} HTTP/1.1\r\nhost: x\r\n\r\n`);
    await until(`the answer to ${request}`, () => answers().length > i && (i < 4 || got.endsWith('hello')));
  }
  const [head, none, get] = answers();
  t.match(head, /^HTTP\/1\.1 200 OK\r\n/);
  t.equal(head?.match(/content-length: 5\r\n/gi)?.length, 1, 'HEAD names the length once');
  t.match(none, /^HTTP\/1\.1 204 /);
  t.notMatch(none, /content-length/i, 'a 204 carries no Content-Length');
  t.match(get, /\r\n\r\nhello$/);
  t.equal(answers().length, 5, 'every request answered, in order');
  sock.destroy();
});

t.test('two different Content-Length headers: the connection is closed and nothing is forwarded', async (t) => {
  const { upstream, port } = await setup(t);
  const reached: string[] = [];
  upstream.handler = (req, res) => {
    reached.push(`${req.method} ${req.url}`);
    res.end('ok');
  };
  const smuggled = 'GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n';
  for (const [first, second] of [
    [5, 5 + smuggled.length],
    [5 + smuggled.length, 5],
  ]) {
    const sock = await rawClient(port);
    let got = '';
    sock.on('data', (d) => {
      got += d.toString();
    });
    const closed = new Promise<void>((resolve) => sock.on('close', () => resolve()));
    sock.write(
      `POST /api/x HTTP/1.1\r\nhost: x\r\ncontent-length: ${first}\r\ncontent-length: ${second}\r\n\r\nhello${smuggled}`,
    );
    t.ok(await settlesWithin(closed, 5000), `${first} then ${second}: closed at once`);
    t.notMatch(got, /ok|smuggled/, 'no request was answered');
  }
  t.same(reached, [], 'the api saw neither the request nor the one inside its body');
  // The same length twice is one length.
  const sock = await rawClient(port);
  let got = '';
  sock.on('data', (d) => {
    got += d.toString();
  });
  sock.write('POST /api/y HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello');
  await until('the answer', () => got.endsWith('ok'));
  t.same(reached, ['POST /api/y'], 'the same length twice is taken');
  sock.destroy();
});

t.test("a body ended in one go gets a Content-Length; a stream's first bytes reach the client at once", async (t) => {
  const { upstream, port } = await setup(t);
  let finish!: () => void;
  upstream.handler = (req, res) => {
    if (req.url === '/whole') return res.end('all of it');
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write('data: first\n\n');
    finish = () => res.end('data: done\n\n');
  };
  const whole = await fetch(`http://127.0.0.1:${port}/whole`);
  t.equal(whole.headers.get('content-length'), '9');
  t.equal(await whole.text(), 'all of it');

  const sock = await rawClient(port);
  let got = '';
  const first = new Promise<void>((resolve) => {
    sock.on('data', (d) => {
      got += d.toString();
      if (got.includes('data: first')) resolve();
    });
  });
  sock.write('GET /stream HTTP/1.1\r\nhost: x\r\n\r\n');
  await first;
  t.match(got, /^HTTP\/1\.1 200 OK/, 'the head and the first event arrived while the answer is open');
  t.match(got, /content-type: text\/event-stream/i);
  t.match(got, /transfer-encoding: chunked/i);
  t.notMatch(got, /data: done/);
  const ended = new Promise((r) => sock.on('data', () => got.includes('0\r\n\r\n') && r(null)));
  finish();
  await ended;
  t.match(got, /data: done/, 'then the body');
  sock.destroy();
});

t.test('a client that disconnects mid-response does not leak the request', async (t) => {
  const { upstream, port, forwarder } = await setup(t);
  let closed = false;
  let aborted = false;
  upstream.handler = (req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('partial');
    req.on('aborted', () => {
      aborted = true;
    });
    res.on('close', () => {
      closed = true;
    });
  };
  const sock = await rawClient(port);
  sock.write('GET /hang HTTP/1.1\r\nhost: x\r\n\r\n');
  await sleep(200);
  t.equal(forwarder.inFlight, 1);
  sock.destroy();
  for (let i = 0; i < 50 && !closed; i++) await sleep(20);
  t.ok(closed, 'the response closed');
  t.ok(aborted, 'and the request was aborted, as node:http tells a dropped connection');
  t.equal(forwarder.inFlight, 0);
});

t.test('an answer given before the upload ends is delivered, and the connection is not reused', async (t) => {
  const { upstream, port } = await setup(t);
  upstream.handler = (req, res) => {
    if (req.url === '/small') return res.end('fine');
    // Answer at once without reading the body, as a body-size limit does.
    res.writeHead(413, { 'content-type': 'application/json', connection: 'close' });
    res.end('{"error":"payload_too_large","message":"too big"}');
  };
  const sock = await rawClient(port);
  let got = '';
  sock.on('data', (d) => {
    got += d.toString();
  });
  const closed = new Promise((r) => sock.on('close', r));
  sock.on('error', () => {});
  sock.write(`PUT /big HTTP/1.1\r\nhost: x\r\ncontent-length: ${8 * MB}\r\n\r\n`);
  sock.write(Buffer.alloc(256 * 1024));
  await closed;
  t.match(got, /^HTTP\/1\.1 413/, 'the early answer arrived');
  t.match(got, /connection: close/i, 'and told the client not to reuse the connection');
  t.match(got, /payload_too_large/);
  const next = await fetch(`http://127.0.0.1:${port}/small`);
  t.equal(await next.text(), 'fine', 'the edge serves the next connection normally');
});

t.test('a body announced larger than the limit is 413 at the edge, never forwarded', async (t) => {
  const { upstream, port } = await setup(t, MB);
  let reached = false;
  upstream.handler = (_req, res) => {
    reached = true;
    res.end('no');
  };
  const res = await fetch(`http://127.0.0.1:${port}/api/upload`, { method: 'POST', body: Buffer.alloc(MB + 1) });
  t.equal(res.status, 413);
  t.same(await res.json(), {
    error: 'payload_too_large',
    message: `The request body is ${MB + 1} bytes, more than the limit of 1 MB.`,
    limit_bytes: MB,
  });
  t.notOk(reached, 'the api never saw it');
  const ok = await fetch(`http://127.0.0.1:${port}/api/upload`, { method: 'POST', body: Buffer.alloc(MB) });
  t.equal(await ok.text(), 'no', 'a body at the limit is forwarded');
});
