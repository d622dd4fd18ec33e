import { REDACTED, SecretSet, StreamRedactor } from '@svc/core';
import fc from 'fast-check';
import t from 'tap';

t.test('values of 8 bytes or more are replaced; shorter ones are left', async (t) => {
  const set = new SecretSet(['hunter2-password', 'short', 'sk-live-12345678']);
  t.equal(
    set.redact('pw hunter2-password and short and sk-live-12345678.'),
    `pw ${REDACTED} and short and ${REDACTED}.`,
  );
});

t.test('a value is also caught JSON-escaped, as it appears inside ACP payloads', async (t) => {
  const secret = 'pa"ss\\word-123';
  const set = new SecretSet([secret]);
  const acp = JSON.stringify({ content: { text: `the value is ${secret}` } });
  t.notOk(set.redact(acp).includes(JSON.stringify(secret).slice(1, -1)));
  t.match(set.redact(acp), REDACTED);
});

t.test('a value split across chunks of one stream is caught', async (t) => {
  const r = new StreamRedactor(new SecretSet(['ABCDEFGHIJ']));
  const out = [r.push('token: ABCD'), r.push('EFG'), r.push('HIJ done'), r.flush()];
  t.equal(out.join(''), `token: ${REDACTED} done`);
  t.notOk(
    out.some((c) => c.includes('ABCD') || c.includes('EFGHIJ')),
    'no chunk carries a piece that reveals it',
  );
});

t.test('property: however the output is chunked, nothing secret leaks and no other text is lost', async (t) => {
  const secretArb = fc.string({ minLength: 8, maxLength: 24, unit: fc.constantFrom('a', 'b', 'c', 'x', '-', '1') });
  fc.assert(
    fc.property(
      fc.uniqueArray(secretArb, { minLength: 1, maxLength: 4 }),
      fc.array(fc.oneof(fc.string({ maxLength: 12, unit: fc.constantFrom('a', 'b', 'z', ' ', '\n') }), fc.nat(3)), {
        maxLength: 20,
      }),
      fc.array(fc.nat(40), { maxLength: 10 }),
      (secrets, parts, cuts) => {
        // Build text from plain parts and secrets (a number picks a secret).
        const text = parts.map((p) => (typeof p === 'number' ? secrets[p % secrets.length] : p)).join('');
        const set = new SecretSet(secrets);
        const positions = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
        const chunks: string[] = [];
        let from = 0;
        for (const p of [...positions, text.length]) {
          chunks.push(text.slice(from, p));
          from = p;
        }
        const r = new StreamRedactor(set);
        const emitted = chunks.map((c) => r.push(c)).concat(r.flush());
        const joined = emitted.join('');
        if (joined !== set.redact(text)) return false;
        return secrets.every((s) => !joined.includes(s));
      },
    ),
    { numRuns: 500 },
  );
  t.pass('500 random chunkings');
});
