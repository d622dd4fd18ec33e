import { signWebhook, verifyWebhookSignature } from '@svc/core';
import fc from 'fast-check';
import t from 'tap';

const SECRET = 'whsec_test-secret';
const NOW = 1_800_000_000;

t.test('a receiver verifies a signature by the pairs it names', async (t) => {
  const body = '{"id":"1","type":"conversation.turn.done"}';
  const header = signWebhook(SECRET, body, NOW);
  t.match(header, /^t=1800000000,v1=[0-9a-f]{64}$/);
  t.same(verifyWebhookSignature({ header, body, secret: SECRET, nowS: NOW }), { ok: true, t: NOW });
  const v1 = header.split(',v1=')[1];
  t.same(
    verifyWebhookSignature({
      header: `v0=abc, t=${NOW}, v2=zz, v1=${'0'.repeat(64)}, v1=${v1}`,
      body,
      secret: SECRET,
      nowS: NOW,
    }),
    { ok: true, t: NOW },
    'other schemes and a second v1 beside it are read by name',
  );
  const bad = (h: string | undefined, b = body, secret = SECRET, nowS = NOW) =>
    verifyWebhookSignature({ header: h, body: b, secret, nowS });
  t.match(bad(header, `${body} `), { ok: false, reason: 'signature does not match' }, 'a changed body');
  t.match(bad(header, body, 'whsec_other'), { ok: false, reason: 'signature does not match' }, 'another secret');
  t.match(bad(header.replace(`t=${NOW}`, `t=${NOW + 1}`)), { ok: false }, 'a changed timestamp');
  t.match(bad(header, body, SECRET, NOW + 301), { ok: false, reason: 'timestamp outside the tolerance' });
  t.match(bad(header, body, SECRET, NOW - 301), { ok: false, reason: 'timestamp outside the tolerance' });
  t.same(bad(header, body, SECRET, NOW + 300), { ok: true, t: NOW }, '300 s is within the tolerance');
  t.match(bad(undefined), { ok: false, reason: 'no signature header' });
  t.match(bad(`v1=${v1}`), { ok: false, reason: 'no timestamp in the signature' });
  t.match(bad(`t=${NOW}`), { ok: false, reason: 'no v1 signature' });
  t.match(bad(`t=${NOW},v1=${v1?.slice(0, 10)}`), { ok: false, reason: 'signature does not match' }, 'a short one');
});

t.test('any body verifies with its own signature and fails once a byte changes', async (t) => {
  fc.assert(
    fc.property(fc.uint8Array({ minLength: 1, maxLength: 512 }), fc.nat(), (bytes, at) => {
      const body = Buffer.from(bytes);
      const header = signWebhook(SECRET, body, NOW);
      if (!verifyWebhookSignature({ header, body, secret: SECRET, nowS: NOW }).ok) return false;
      const changed = Buffer.from(body);
      const i = at % changed.length;
      changed[i] = (changed[i] as number) ^ 1;
      return !verifyWebhookSignature({ header, body: changed, secret: SECRET, nowS: NOW }).ok;
    }),
  );
  t.pass('held for every generated body');
});

t.test('arbitrary header text never throws', async (t) => {
  fc.assert(
    fc.property(fc.string(), (header) => {
      const r = verifyWebhookSignature({ header, body: '{}', secret: SECRET, nowS: NOW });
      return r.ok === false;
    }),
  );
  t.pass('every header answered');
});
