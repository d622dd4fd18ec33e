/**
 * TRUST_PROXY: the client's address comes from X-Forwarded-For only through trusted hops, on
 * both servers (the edge, and the api role alone). The rate limit buckets by that address and
 * audit rows record it. Real sockets: the test client connects from 127.0.0.1, which plays
 * the load balancer when it is trusted and an ordinary client when it is not.
 */
import { isIP } from 'node:net';
import { loadConfig } from '@svc/gateway';
import fc from 'fast-check';
import t from 'tap';
import {
  addressText,
  canonicalIp,
  clientAddress,
  exemptList,
  exemptMatcher,
  isExempt,
} from '../../gateway/src/addresses.ts';
import { signUp, startTestService, type TestService } from './harness.ts';

async function get(svc: TestService, forwardedFor?: string): Promise<number> {
  const res = await fetch(`${svc.url}/api/health`, {
    headers: forwardedFor === undefined ? {} : { 'x-forwarded-for': forwardedFor },
  });
  await res.arrayBuffer();
  return res.status;
}

t.test('TRUST_PROXY is checked at start and a bad entry is named', async (t) => {
  t.same(loadConfig({ TRUST_PROXY: '10.0.0.0/8, 127.0.0.1, ::1, fd00::/8' }).TRUST_PROXY, [
    '10.0.0.0/8',
    '127.0.0.1',
    '::1',
    'fd00::/8',
  ]);
  t.throws(
    () => loadConfig({ TRUST_PROXY: '10.0.0.0/33' }),
    /TRUST_PROXY: 10\.0\.0\.0\/33: the prefix must be 0 to 32/,
  );
  t.throws(() => loadConfig({ TRUST_PROXY: 'lb.internal' }), /TRUST_PROXY: lb\.internal is not an address or a CIDR/);
  t.throws(() => loadConfig({ TRUST_PROXY: '10.0.0.0/8/1' }), /TRUST_PROXY/);
});

t.test("the exemption check remembers answers and gives the BlockList's, past its memory too", async (t) => {
  const cidrs = ['10.0.0.0/8', '192.0.2.7', 'fd00::/8', '::1'];
  const list = exemptList(cidrs);
  const matcher = exemptMatcher(cidrs);
  // Twice over more addresses than the memory holds, so it starts over at least once and
  // answers from memory for the repeated ones.
  const addresses = fc.sample(fc.oneof(fc.ipV4(), fc.ipV6(), fc.constantFrom('10.1.2.3', '192.0.2.7', '::1')), {
    numRuns: 5000,
    seed: 23,
  });
  let wrong = 0;
  let exempt = 0;
  for (const ip of [...addresses, ...addresses]) {
    const want = isExempt(list, ip);
    if (want) exempt++;
    if (matcher(ip) !== want) wrong++;
  }
  t.equal(wrong, 0, "every answer is the BlockList's");
  t.ok(exempt > 0 && exempt < addresses.length * 2, 'both answers were asked for');
  t.equal(exemptMatcher([])('10.1.2.3'), false, 'no entries: nothing is exempt');
});

t.test(
  'whatever X-Forwarded-For holds, the client is an address, and an untrusted peer is never overruled',
  async (t) => {
    const trusted = exemptMatcher(['127.0.0.1', '10.0.0.0/8']);
    const entry = fc.oneof(
      fc.ipV4(),
      fc.ipV6(),
      fc.string(),
      fc.constantFrom('10.9.9.9', ' 10.1.1.1 ', '[::1]:80', ''),
    );
    const header = fc.array(entry, { maxLength: 6 }).map((xs) => xs.join(','));
    t.doesNotThrow(() =>
      fc.assert(
        fc.property(
          header,
          (xff) =>
            isIP(clientAddress('127.0.0.1', xff, trusted)) !== 0 &&
            clientAddress('192.0.2.1', xff, trusted) === '192.0.2.1',
        ),
        { numRuns: 500 },
      ),
    );
  },
);

t.test("the edge's reading of a peer address from its bytes is the canonical form of uWS's text", async (t) => {
  // uWebSockets.js's text: dotted for 4 bytes, eight zero-padded hex groups for 16.
  const uwsText = (b: Uint8Array) =>
    b.length === 4
      ? [...b].join('.')
      : Array.from({ length: 8 }, (_, i) =>
          (((b[2 * i] as number) << 8) | (b[2 * i + 1] as number)).toString(16).padStart(4, '0'),
        ).join(':');
  const bytes = fc.oneof(
    fc.uint8Array({ minLength: 4, maxLength: 4 }),
    fc.uint8Array({ minLength: 16, maxLength: 16 }),
    // IPv4-mapped, as a dual-stack socket reports an IPv4 peer; and runs of zeros to compress.
    fc.uint8Array({ minLength: 4, maxLength: 4 }).map((v4) => Uint8Array.from([...Array(10).fill(0), 255, 255, ...v4])),
    fc.array(fc.constantFrom(0, 0, 0, 1, 255), { minLength: 16, maxLength: 16 }).map((a) => Uint8Array.from(a)),
  );
  t.doesNotThrow(() =>
    fc.assert(
      fc.property(bytes, (b) => addressText(b) === canonicalIp(uwsText(b)) && isIP(addressText(b)) !== 0),
      { numRuns: 2000 },
    ),
  );
  t.equal(addressText(Uint8Array.from([...Array(10).fill(0), 255, 255, 127, 0, 0, 1])), '127.0.0.1');
  t.equal(addressText(Uint8Array.from([...Array(15).fill(0), 1])), '::1');
});

for (const edge of [true, false]) {
  t.test(`an untrusted peer's X-Forwarded-For is ignored: the limit buckets by the peer (EDGE=${edge})`, async (t) => {
    const svc = await startTestService(t, {
      backend: 'embedded',
      env: { EDGE: String(edge), RATE_LIMIT_PER_MINUTE: '3' },
    });
    // The harness spent one request from this peer already, reading the OpenAPI document.
    const statuses = [];
    for (let i = 0; i < 4; i++) statuses.push(await get(svc, `203.0.113.${i + 1}`));
    t.same(statuses, [200, 200, 429, 429], 'a new spoofed address each time buys nothing');
  });

  t.test(`through trusted proxies, the client is the first untrusted hop from the right (EDGE=${edge})`, async (t) => {
    const svc = await startTestService(t, {
      backend: 'embedded',
      env: { EDGE: String(edge), RATE_LIMIT_PER_MINUTE: '2', TRUST_PROXY: '127.0.0.1/32, 10.0.0.0/8' },
    });
    // The load balancer (127.0.0.1) saw 10.1.2.3, an inner proxy, which saw the client.
    t.same(
      [await get(svc, '198.51.100.7, 10.1.2.3'), await get(svc, '198.51.100.7, 10.1.2.3')],
      [200, 200],
      'the client has a bucket of its own',
    );
    t.equal(await get(svc, '198.51.100.7, 10.1.2.3'), 429, 'and spends it');
    t.equal(await get(svc, '1.1.1.1, 198.51.100.7, 10.1.2.3'), 429, 'what the client wrote in front is not read');
    t.equal(await get(svc, '198.51.100.7,10.1.2.3'), 429, 'spacing does not matter');
    t.equal(await get(svc, '198.51.100.8, 10.1.2.3'), 200, 'another client behind the same proxies is not limited');
    t.equal(await get(svc, '203.0.113.9'), 200, 'one hop: the load balancer saw the client');
    // The harness spent one request from this peer already, reading the OpenAPI document.
    t.equal(await get(svc), 200, 'no header: the peer itself');
    t.equal(await get(svc), 429, 'the peer spends its own bucket');
  });

  t.test(`audit rows record the client the trusted proxies name (EDGE=${edge})`, async (t) => {
    const svc = await startTestService(t, {
      backend: 'embedded',
      env: { EDGE: String(edge), TRUST_PROXY: '127.0.0.1' },
    });
    const me = await signUp(svc);
    const created = await svc.http.post('/api/auth/api-keys', {
      token: me.key,
      body: { name: 'ci' },
      headers: { 'x-forwarded-for': '1.1.1.1, 198.51.100.23' },
    });
    t.equal(created.status, 201);
    const audit = await svc.http.get('/api/audit?action_prefix=api_key.created', { token: me.key });
    t.equal(audit.body.data[0]?.request_ip, '198.51.100.23');
  });
}
