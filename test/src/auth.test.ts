import t from 'tap';
import { backends, PASSWORD, signUp, startTestService, tokenFrom, uniqueEmail, waitForMail } from './harness.ts';

for (const backend of backends()) {
  t.test(`accounts on ${backend}`, async (t) => {
    const svc = await startTestService(t, { backend });
    const { http } = svc;

    t.test('a new account registers, verifies by the mailed link, and gets a key that works', async (t) => {
      const email = uniqueEmail();
      const reg = await http.post('/api/auth/register', { body: { email, password: PASSWORD } });
      t.equal(reg.status, 201);
      t.equal(reg.body.status, 'verification_sent');

      const early = await http.post('/api/auth/token', { body: { email, password: PASSWORD } });
      t.equal(early.status, 403, 'an unverified account gets no key');
      t.equal(early.body.error, 'email_not_verified');

      const mail = await waitForMail(svc.mailDir, email, /verify/i);
      t.match(mail.text, /token=/);
      t.type(mail.html, 'string');
      const token = tokenFrom(mail);
      const verified = await http.post('/api/auth/verify', { body: { token } });
      t.equal(verified.status, 200);
      t.same(verified.body, { verified: true, email });
      t.equal(verified.headers.get('set-cookie'), null, 'verify issues no session');

      const again = await http.post('/api/auth/verify', { body: { token } });
      t.equal(again.status, 200, 'verify is idempotent');

      const key = await http.post('/api/auth/token', { body: { email, password: PASSWORD } });
      t.equal(key.status, 201);
      t.match(key.body.key, /^svc_[A-Za-z0-9_-]{43}$/);
      t.equal(key.body.scope, 'full');
      t.equal(key.body.prefix, key.body.key.slice(0, 12));

      const me = await http.get('/api/auth/me', { token: key.body.key });
      t.equal(me.status, 200);
      t.equal(me.body.email, email);
      t.equal(me.body.email_verified, true);
      t.equal(me.body.role, 'user');
      t.equal(me.body.actor, 'api');
      t.equal(me.body.comped, null, 'comped is null while payment is off');
    });

    t.test('resend-verification mails a fresh link and retires the old one; it never reveals an address', async (t) => {
      const email = uniqueEmail();
      await http.post('/api/auth/register', { body: { email, password: PASSWORD } });
      const first = tokenFrom(await waitForMail(svc.mailDir, email, /verify/i));
      const resent = await http.post('/api/auth/resend-verification', { body: { email } });
      const unknown = await http.post('/api/auth/resend-verification', { body: { email: uniqueEmail('nobody') } });
      t.equal(resent.status, 200);
      t.same(resent.body, unknown.body, 'same answer for an unknown address');
      let second = first;
      for (let i = 0; i < 100 && second === first; i++) {
        second = tokenFrom(await waitForMail(svc.mailDir, email, /verify/i));
        if (second === first) await new Promise((r) => setTimeout(r, 50));
      }
      t.not(second, first, 'a new link was mailed');
      const old = await http.post('/api/auth/verify', { body: { token: first } });
      t.equal(old.status, 422, 'the older link no longer works');
      t.equal((await http.post('/api/auth/verify', { body: { token: second } })).status, 200);
    });

    t.test('registering a taken address answers the same and mails the owner instead', async (t) => {
      const { email } = await signUp(svc);
      const reg = await http.post('/api/auth/register', { body: { email: email.toUpperCase(), password: PASSWORD } });
      t.equal(reg.status, 201);
      t.equal(reg.body.status, 'verification_sent');
      const mail = await waitForMail(svc.mailDir, email, /tried to register/);
      t.notMatch(mail.text, /token=/);
    });

    t.test('wrong password and unknown address are the same 401', async (t) => {
      const { email } = await signUp(svc);
      const wrong = await http.post('/api/auth/token', { body: { email, password: 'not the password' } });
      const unknown = await http.post('/api/auth/token', {
        body: { email: uniqueEmail('nobody'), password: PASSWORD },
      });
      t.equal(wrong.status, 401);
      t.equal(unknown.status, 401);
      t.same(wrong.body, unknown.body);
    });

    t.test('a verify token that was never issued is 422 invalid_token', async (t) => {
      const r = await http.post('/api/auth/verify', { body: { token: 'x'.repeat(43) } });
      t.equal(r.status, 422);
      t.equal(r.body.error, 'invalid_token');
    });

    t.test('malformed input is a clear 4xx and creates nothing', async (t) => {
      const notJson = await http.post('/api/auth/register', {
        rawBody: '{"email": ',
        headers: { 'content-type': 'application/json' },
      });
      t.equal(notJson.status, 400);
      t.equal(notJson.body.error, 'invalid_request');

      const notObject = await http.post('/api/auth/register', { body: [1, 2] });
      t.equal(notObject.status, 400);
      t.equal(notObject.body.error, 'invalid_request');

      const wrongType = await http.post('/api/auth/register', {
        rawBody: 'email=a@b.c',
        headers: { 'content-type': 'text/plain' },
      });
      t.equal(wrongType.status, 400);
      t.equal(wrongType.body.error, 'invalid_request');

      const email = uniqueEmail();
      const short = await http.post('/api/auth/register', { body: { email, password: 'short' } });
      t.equal(short.status, 422);
      t.equal(short.body.error, 'validation_failed');
      t.ok(short.body.details.password, 'details names the field');
      const badEmail = await http.post('/api/auth/register', { body: { email: 'not-an-email', password: PASSWORD } });
      t.equal(badEmail.status, 422);
      t.ok(badEmail.body.details.email);

      const tok = await http.post('/api/auth/token', { body: { email, password: PASSWORD } });
      t.equal(tok.status, 401, 'the refused registration created no account');
    });

    t.test('unknown routes and wrong methods answer in the error shape', async (t) => {
      const missing = await http.get('/api/nope');
      t.equal(missing.status, 404);
      t.equal(missing.body.error, 'not_found');
      const wrongMethod = await http.call('PATCH', '/api/auth/me');
      t.equal(wrongMethod.status, 405);
      t.equal(wrongMethod.body.error, 'method_not_allowed');
      t.match(wrongMethod.headers.get('allow'), /GET/);
    });

    t.test('an absent or bogus bearer key is 401', async (t) => {
      const none = await http.get('/api/auth/me');
      t.equal(none.status, 401);
      t.same(Object.keys(none.body).sort(), ['error', 'message']);
      const bogus = await http.get('/api/auth/me', { token: 'svc_notakey' });
      t.equal(bogus.status, 401);
      const malformed = await http.get('/api/auth/me', { headers: { authorization: 'Basic abc' } });
      t.equal(malformed.status, 401);
    });
  });
}
