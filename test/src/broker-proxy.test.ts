/**
 * The broker in the egress proxy, without a sandbox around it: what a brokered sandbox sends
 * is read however it travels. A placeholder in a body, in plain http through a CONNECT tunnel,
 * in another protocol's tunnel, or in a WebSocket's frames never leaves; a WebSocket upgrade is
 * brokered as a request is, and its frames flow both ways.
 */
import { createServer, type IncomingHttpHeaders, request } from 'node:http';
import { type AddressInfo, createServer as createNetServer, type Socket } from 'node:net';
import { EgressProxy, placeholderGuard, SandboxBroker, SandboxCa } from 'svc-runner';
import t from 'tap';

const PLACEHOLDER = 'svc-placeholder-0123456789abcdef0123';
const REAL = 'real-secret-value-0123456789';

/** Resolves with everything `stream` gives until it ends, or the error it fails with. */
function drain(stream: NodeJS.ReadableStream): Promise<{ data: string; error?: string }> {
  return new Promise((resolve) => {
    let data = '';
    stream.on('data', (d) => {
      data += d;
    });
    stream.on('end', () => resolve({ data }));
    stream.on('error', (err: Error) => resolve({ data, error: err.message }));
  });
}

t.test('placeholderGuard passes what has no placeholder and fails on one split across chunks', async (t) => {
  const binding = { binding_id: 'sb_1', placeholder: PLACEHOLDER, host: 'api.test', header: 'x', value: REAL };
  const clean = placeholderGuard([binding]);
  const cleanOut = drain(clean);
  for (const part of ['hello ', 'svc-placeholder-', 'but not that one', ' end']) clean.write(part);
  clean.end();
  t.same(await cleanOut, { data: 'hello svc-placeholder-but not that one end' }, 'all of it, in order');

  const dirty = placeholderGuard([binding]);
  const dirtyOut = drain(dirty);
  dirty.write(`x=${PLACEHOLDER.slice(0, 10)}`);
  dirty.write(PLACEHOLDER.slice(10));
  dirty.end();
  const seen = await dirtyOut;
  t.match(seen.error, /placeholder/, 'it fails');
  t.equal(seen.data, `x=${PLACEHOLDER.slice(0, 10)}`, 'at the chunk that completes it: only its beginning went on');
});

t.test('a brokered sandbox’s bodies, plain tunnels and WebSockets are read by the broker', async (t) => {
  // The bound host, over plain http (the broker reads plain http tunnelled to it too), which
  // also takes WebSocket upgrades and echoes their frames.
  const bound: { headers: IncomingHttpHeaders; body: string }[] = [];
  const boundServer = createServer((req, res) => {
    let body = '';
    req.on('data', (d) => {
      body += d;
    });
    req.on('end', () => {
      bound.push({ headers: req.headers, body });
      res.end('bound answered');
    });
  });
  const upgrades: IncomingHttpHeaders[] = [];
  boundServer.on('upgrade', (req, socket: Socket) => {
    upgrades.push(req.headers);
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
    socket.on('data', (d) => socket.write(`echo:${d}`));
    socket.on('error', () => {});
  });
  await new Promise<void>((resolve) => boundServer.listen(0, '127.0.0.2', resolve));
  const boundPort = (boundServer.address() as AddressInfo).port;
  // Another allowed host, which must never hear a placeholder.
  const elsewhere: string[] = [];
  const elsewhereServer = createNetServer((s) => {
    s.on('data', (d) => elsewhere.push(d.toString()));
    s.on('error', () => {});
  });
  await new Promise<void>((resolve) => elsewhereServer.listen(0, '127.0.0.3', resolve));
  const elsewherePort = (elsewhereServer.address() as AddressInfo).port;
  const refusals: string[] = [];
  const rows: { method: string; host: string; status: number | null; refused: boolean; reason: string | null }[] = [];
  const proxy = await EgressProxy.start(
    (_grant, host, reason) => refusals.push(`${host}: ${reason}`),
    (_source, row) => rows.push(row),
  );
  t.teardown(async () => {
    await proxy.close();
    boundServer.close();
    elsewhereServer.close();
  });
  const broker = new SandboxBroker(await SandboxCa.create('sbx_proxy'), 'cnv_proxy');
  broker.add([
    {
      binding_id: 'sb_1',
      placeholder: PLACEHOLDER,
      host: `127.0.0.2:${boundPort}`,
      header: 'authorization',
      value: `Bearer ${REAL}`,
    },
  ]);
  proxy.setBroker('sbx_proxy', 1, broker);
  const url = new URL(
    proxy.grant({
      sandbox: 'sbx_proxy',
      incarnation: 1,
      conversationId: 'cnv_proxy',
      allowedHosts: [`127.0.0.2:${boundPort}`, `127.0.0.3:${elsewherePort}`],
    }),
  );
  const auth = `Basic ${Buffer.from(`${url.username}:${url.password}`).toString('base64')}`;

  /** A CONNECT tunnel to `target` through the proxy: the socket once it is open. */
  const tunnel = (target: string) =>
    new Promise<Socket>((resolve, reject) => {
      const req = request({
        host: '127.0.0.1',
        port: proxy.port,
        method: 'CONNECT',
        path: target,
        headers: { 'proxy-authorization': auth },
      });
      req.on('connect', (res, socket: Socket) =>
        res.statusCode === 200 ? resolve(socket) : reject(new Error(`CONNECT ${res.statusCode}`)),
      );
      req.on('error', reject);
      req.end();
    });
  /**
   * Writes `text` (a request asking to close the connection after its answer) over a new
   * tunnel to `target` and resolves with all that comes back.
   */
  const overTunnel = async (target: string, text: string) => {
    const socket = await tunnel(target);
    const answer = drain(socket);
    socket.write(text);
    return (await answer).data;
  };

  t.test('a placeholder in a POST body to another host is refused, and never reaches it', async (t) => {
    const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = request(
        {
          host: '127.0.0.1',
          port: proxy.port,
          method: 'POST',
          path: `http://127.0.0.3:${elsewherePort}/collect`,
          headers: { 'proxy-authorization': auth, 'content-type': 'text/plain' },
        },
        (res) => void drain(res).then(({ data }) => resolve({ status: res.statusCode ?? 0, body: data })),
      );
      req.on('error', reject);
      req.write('harmless start, then ');
      setTimeout(() => req.end(`the token=${PLACEHOLDER}`), 50);
    });
    t.equal(answer.status, 403, answer.body);
    t.match(answer.body, /placeholder/);
    t.notOk(elsewhere.join('').includes(PLACEHOLDER), 'the other host never got the placeholder');
    t.ok(
      rows.some((r) => r.host === '127.0.0.3' && r.refused && /placeholder/.test(r.reason ?? '')),
      'logged',
    );
  });

  t.test('plain http through a tunnel is brokered: the real header for the bound host', async (t) => {
    const got = await overTunnel(
      `127.0.0.2:${boundPort}`,
      `POST /v1/things HTTP/1.1\r\nHost: 127.0.0.2:${boundPort}\r\nAuthorization: Bearer ${PLACEHOLDER}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello`,
    );
    t.match(got, /^HTTP\/1\.1 200/, got);
    t.match(got, /bound answered$/);
    t.equal(bound.at(-1)?.headers.authorization, `Bearer ${REAL}`, 'the bound host got the real value');
    t.equal(bound.at(-1)?.body, 'hello');
    t.ok(
      rows.some((r) => r.host === '127.0.0.2' && r.method === 'POST' && r.status === 200),
      'logged as a POST',
    );
  });

  t.test('plain http through a tunnel to another host with the placeholder is refused', async (t) => {
    const got = await overTunnel(
      `127.0.0.3:${elsewherePort}`,
      `GET /collect HTTP/1.1\r\nHost: 127.0.0.3\r\nX-Leak: ${PLACEHOLDER}\r\nConnection: close\r\n\r\n`,
    );
    t.match(got, /^HTTP\/1\.1 403/, got);
    t.notOk(elsewhere.join('').includes(PLACEHOLDER), 'the other host never got it');
  });

  t.test('another protocol’s tunnel is cut before a placeholder leaves in it', async (t) => {
    const socket = await tunnel(`127.0.0.3:${elsewherePort}`);
    const closed = drain(socket);
    socket.write('\x00\x01binary hello ');
    await new Promise((r) => setTimeout(r, 100));
    socket.write(`and then ${PLACEHOLDER}`);
    await closed;
    const heard = elsewhere.join('');
    t.match(heard, 'binary hello', 'what came before went through at once');
    t.notOk(heard.includes(PLACEHOLDER), 'the placeholder did not');
    t.ok(
      refusals.some((r) => r.startsWith('127.0.0.3')),
      'the refusal was heard',
    );
  });

  t.test('a WebSocket upgrade is brokered, and its frames flow both ways', async (t) => {
    const socket = await tunnel(`127.0.0.2:${boundPort}`);
    let heard = '';
    socket.on('data', (d) => {
      heard += d;
    });
    socket.write(
      `GET /ws HTTP/1.1\r\nHost: 127.0.0.2:${boundPort}\r\nAuthorization: Bearer ${PLACEHOLDER}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n`,
    );
    for (let i = 0; i < 100 && !heard.includes('\r\n\r\n'); i++) await new Promise((r) => setTimeout(r, 20));
    t.match(heard, /^HTTP\/1\.1 101 Switching Protocols\r\n/, heard);
    t.equal(upgrades.at(-1)?.authorization, `Bearer ${REAL}`, 'the upgrade carried the real value');
    socket.write('ping');
    for (let i = 0; i < 100 && !heard.includes('echo:ping'); i++) await new Promise((r) => setTimeout(r, 20));
    t.match(heard, 'echo:ping', 'a frame went and came back');
    socket.write(`leak ${PLACEHOLDER}`);
    await drain(socket);
    t.notMatch(heard, `echo:leak`, 'a frame with the placeholder never reached the host');
    t.ok(
      rows.some((r) => r.host === '127.0.0.2' && r.method === 'GET' && r.status === 101),
      'logged with its 101',
    );
  });
});
