import t from 'tap';
import { exemptList } from '../../gateway/src/addresses.ts';
import { addressProblem } from '../../gateway/src/webhooks/addresses.ts';
import { postSafely, type Resolver } from '../../gateway/src/webhooks/transport.ts';
import { startReceiver } from './webhook-receiver.ts';

const HOST = 'hooks.test';

t.test('addresses a webhook may not reach, and ones it may', async (t) => {
  const refused: [string, RegExp][] = [
    ['127.0.0.1', /loopback/],
    ['127.255.0.9', /loopback/],
    ['::1', /loopback/],
    ['10.0.0.1', /private/],
    ['10.255.255.255', /private/],
    ['172.16.0.1', /private/],
    ['172.31.255.254', /private/],
    ['192.168.1.1', /private/],
    ['169.254.169.254', /link-local/],
    ['100.64.0.1', /carrier-grade NAT/],
    ['100.127.255.254', /carrier-grade NAT/],
    ['0.0.0.0', /this network/],
    ['192.0.2.10', /documentation/],
    ['198.51.100.7', /documentation/],
    ['203.0.113.200', /documentation/],
    ['198.18.0.1', /benchmarking/],
    ['224.0.0.251', /multicast/],
    ['239.255.255.250', /multicast/],
    ['240.0.0.1', /reserved/],
    ['255.255.255.255', /reserved/],
    ['::ffff:127.0.0.1', /carries 127\.0\.0\.1 is loopback/],
    ['::ffff:7f00:1', /carries 127\.0\.0\.1 is loopback/],
    ['0:0:0:0:0:ffff:a9fe:a9fe', /carries 169\.254\.169\.254 is link-local/],
    ['::ffff:10.1.2.3', /carries 10\.1\.2\.3 is private/],
    ['64:ff9b::a00:1', /carries 10\.0\.0\.1 is private/],
    ['::', /unspecified/],
    ['fc00::1', /unique local/],
    ['fd12:3456::1', /unique local/],
    ['fe80::1', /link-local/],
    ['ff02::1', /multicast/],
    ['2001:db8::1', /documentation/],
    ['2002:7f00:1::1', /6to4/],
    ['100::1', /discard/],
    ['::ffff:0:0', /this network/],
    ['4000::1', /reserved/],
  ];
  for (const [ip, why] of refused) t.match(addressProblem(ip), why, `${ip} is refused`);
  for (const ip of [
    '93.184.216.34',
    '8.8.8.8',
    '1.1.1.1',
    '172.32.0.1',
    '100.128.0.1',
    '2606:4700::1111',
    '::ffff:8.8.8.8',
  ]) {
    t.equal(addressProblem(ip), undefined, `${ip} is public`);
  }
  t.match(addressProblem('not-an-ip'), /not an IP address/);
  const allowed = exemptList(['10.1.0.0/16', 'fd00::/8']);
  t.equal(addressProblem('10.1.2.3', allowed), undefined, 'an allowed range is let through');
  t.equal(addressProblem('::ffff:10.1.2.3', allowed), undefined, 'also IPv4-mapped');
  t.equal(addressProblem('fd00::5', allowed), undefined);
  t.match(addressProblem('10.2.0.1', allowed), /private/, 'and only that range');
  t.match(addressProblem('127.0.0.1', allowed), /loopback/);
});

t.test('postSafely refuses before connecting, and at connect time', async (t) => {
  const receiver = await startReceiver(t, HOST, () => ({ status: 200, body: 'ok' }));
  const url = `https://${HOST}:${receiver.port}/hook`;
  const send = (resolve: Resolver, allowed?: string[]) =>
    postSafely(url, { 'svc-event-id': '1' }, '{}', {
      resolve,
      allowed: allowed && exemptList(allowed),
      ca: receiver.ca,
      timeoutMs: 5000,
      keepBytes: 4096,
    });

  t.test('through a test resolver, each refused answer fails the attempt with a clear detail', async (t) => {
    for (const address of [
      '127.0.0.1',
      '::1',
      '10.0.0.8',
      '169.254.169.254',
      '100.64.3.4',
      '::ffff:127.0.0.1',
      '192.0.2.1',
      'fc00::9',
    ]) {
      const result = await send(async () => [address]);
      t.equal(result.statusCode, null, address);
      t.match(result.detail, new RegExp(`^refused: ${HOST} resolves to ${address.replace(/[.]/g, '\\.')} `), address);
    }
    const mixed = await send(async () => ['93.184.216.34', '10.0.0.8']);
    t.match(mixed.detail, /10\.0\.0\.8 is private/, 'one private answer among public ones refuses the host');
    const none = await send(async () => {
      throw new Error('ENOTFOUND');
    });
    t.match(none.detail, /could not resolve hooks\.test/);
    t.equal(receiver.received.length, 0, 'nothing reached the receiver');
  });

  t.test('an allowed range reaches the receiver, by its name (Host, SNI)', async (t) => {
    const result = await send(async () => ['127.0.0.1'], ['127.0.0.1/32']);
    t.same(result, { statusCode: 200, detail: 'ok' });
    t.equal(receiver.received.length, 1);
    t.equal(receiver.received[0]?.servername, HOST);
    t.equal(receiver.received[0]?.headers.host, `${HOST}:${receiver.port}`);
  });

  t.test('a host whose first address takes no connection is reached at its next one', async (t) => {
    const before = receiver.received.length;
    // The receiver listens on 127.0.0.1 only: 127.0.0.2 refuses the connection.
    const result = await send(async () => ['127.0.0.2', '127.0.0.1'], ['127.0.0.0/8']);
    t.same(result, { statusCode: 200, detail: 'ok' });
    t.equal(receiver.received.length, before + 1, 'delivered once');
    t.equal(receiver.received.at(-1)?.servername, HOST, 'still by its name');
    const dead = await send(async () => ['127.0.0.2', '127.0.0.3'], ['127.0.0.0/8']);
    t.equal(dead.statusCode, null);
    t.match(dead.detail, /ECONNREFUSED/, 'when none answers, the attempt fails saying why');
    const oneRefused = await send(async () => ['127.0.0.2', '10.0.0.8', '127.0.0.1'], ['127.0.0.0/8']);
    t.match(oneRefused.detail, /10\.0\.0\.8 is private/, 'every address is checked before any is dialled');
    t.equal(receiver.received.length, before + 1, 'so that host got nothing');
  });

  t.test('DNS rebinding: a public first answer then a private one is refused at connect time', async (t) => {
    const before = receiver.received.length;
    const answers = [['93.184.216.34'], ['127.0.0.1']];
    let asked = 0;
    const result = await send(async () => answers[Math.min(asked++, 1)] as string[]);
    t.equal(asked, 2, 'resolved before the request and again when connecting');
    t.equal(result.statusCode, null);
    t.match(result.detail, /^refused: hooks\.test resolves to 127\.0\.0\.1 is loopback/);
    t.equal(receiver.received.length, before, 'nothing reached the receiver');
  });

  t.test('a receiver whose certificate is not trusted fails the attempt, not the worker', async (t) => {
    const result = await postSafely(url, {}, '{}', {
      resolve: async () => ['127.0.0.1'],
      allowed: exemptList(['127.0.0.1/32']),
      timeoutMs: 5000,
      keepBytes: 4096,
    });
    t.equal(result.statusCode, null);
    t.match(result.detail, /certificate/i);
  });
});
