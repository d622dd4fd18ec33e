import t from 'tap';
import { PASSWORD, signUp, startTestService, tokenFrom, uniqueEmail, waitForMail } from './harness.ts';

t.test('API keys, sessions and scopes', async (t) => {
  const svc = await startTestService(t);
  const { http } = svc;

  t.test('a key is shown once, listed by prefix, and stops working when revoked', async (t) => {
    const { key } = await signUp(svc);
    const made = await http.post('/api/auth/api-keys', { token: key, body: { name: 'ci', scope: 'standard' } });
    t.equal(made.status, 201);
    t.equal(made.body.name, 'ci');
    t.equal(made.body.scope, 'standard');
    const list = await http.get('/api/auth/api-keys', { token: key });
    t.equal(list.status, 200);
    const listed = list.body.data.find((k: { id: string }) => k.id === made.body.id);
    t.ok(listed, 'the new key is listed');
    t.equal(listed.prefix, made.body.key.slice(0, 12));
    t.notOk('key' in listed, 'the plaintext is not listed');
    t.notMatch(list.text, made.body.key, 'the plaintext appears nowhere in the list');

    t.equal((await http.get('/api/auth/me', { token: made.body.key })).status, 200);
    const del = await http.delete(`/api/auth/api-keys/${made.body.id}`, { token: key });
    t.equal(del.status, 204);
    t.equal((await http.get('/api/auth/me', { token: made.body.key })).status, 401, 'revoked key is refused');
    const again = await http.delete(`/api/auth/api-keys/${made.body.id}`, { token: key });
    t.equal(again.status, 404);
  });

  t.test("another tenant's key id is 404 and stays alive", async (t) => {
    const a = await signUp(svc);
    const b = await signUp(svc);
    const bKey = await http.post('/api/auth/api-keys', { token: b.key, body: {} });
    const del = await http.delete(`/api/auth/api-keys/${bKey.body.id}`, { token: a.key });
    t.equal(del.status, 404);
    t.equal(del.body.error, 'not_found');
    t.equal((await http.get('/api/auth/me', { token: bKey.body.key })).status, 200);
    const aList = await http.get('/api/auth/api-keys', { token: a.key });
    t.notOk(
      aList.body.data.some((k: { id: string }) => k.id === bKey.body.id),
      "b's key is not in a's list",
    );
  });

  t.test('full-scope routes refuse a standard key with 403', async (t) => {
    const { key } = await signUp(svc);
    const std = (await http.post('/api/auth/api-keys', { token: key, body: { scope: 'standard' } })).body.key;
    const creds = await http.get('/api/account/inference-credentials', { token: std });
    t.equal(creds.status, 403);
    t.equal(creds.body.error, 'forbidden');
    const pw = await http.post('/api/auth/password', {
      token: std,
      body: { current_password: PASSWORD, new_password: 'another long password' },
    });
    t.equal(pw.status, 403);
    const del = await http.delete('/api/account', { token: std, body: { confirm: 'x' } });
    t.equal(del.status, 403);
    const escalate = await http.post('/api/auth/api-keys', { token: std, body: { scope: 'full' } });
    t.equal(escalate.status, 403, 'a standard key cannot mint a full key');
    t.equal((await http.get('/api/account/onboarding', { token: std })).status, 200, 'ordinary routes work');
  });

  t.test('an expiring key carries its expiry', async (t) => {
    const { key } = await signUp(svc);
    const made = await http.post('/api/auth/api-keys', { token: key, body: { expires_in_days: 7 } });
    t.equal(made.status, 201);
    const days = (Date.parse(made.body.expires_at) - Date.now()) / 86_400_000;
    t.ok(days > 6.9 && days <= 7, `expires in ${days.toFixed(2)} days`);
    const bad = await http.post('/api/auth/api-keys', { token: key, body: { expires_in_days: 0 } });
    t.equal(bad.status, 422);
    const unknown = await http.post('/api/auth/api-keys', { token: key, body: { colour: 'red' } });
    t.equal(unknown.status, 422, 'unknown fields are refused');
  });

  t.test('console login sets an HttpOnly SameSite=Lax cookie; logout ends it', async (t) => {
    const { email } = await signUp(svc);
    const login = await http.post('/api/auth/login', { body: { email, password: PASSWORD } });
    t.equal(login.status, 200);
    const setCookie = login.headers.get('set-cookie') ?? '';
    t.match(setCookie, /^svc_session=/);
    t.match(setCookie, /HttpOnly/i);
    t.match(setCookie, /SameSite=Lax/i);
    t.notMatch(setCookie, /Secure/i, 'not Secure over plain http');
    const cookie = setCookie.split(';')[0] as string;
    const me = await http.get('/api/auth/me', { cookie });
    t.equal(me.status, 200);
    t.equal(me.body.actor, 'ui');

    const crossOrigin = await http.post('/api/account/onboarding/complete', {
      cookie,
      headers: { origin: 'https://evil.example' },
    });
    t.equal(crossOrigin.status, 403, 'a cookie write from another origin is refused');
    const sameOrigin = await http.post('/api/account/onboarding/complete', { cookie, headers: { origin: svc.url } });
    t.equal(sameOrigin.status, 200);

    t.equal((await http.post('/api/auth/logout', { cookie })).status, 204);
    t.equal((await http.get('/api/auth/me', { cookie })).status, 401, 'the session is over');
  });

  t.test('a password change signs out browser sessions only; API keys stay', async (t) => {
    const { email, key } = await signUp(svc);
    const login = await http.post('/api/auth/login', { body: { email, password: PASSWORD } });
    const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0] as string;
    const wrong = await http.post('/api/auth/password', {
      token: key,
      body: { current_password: 'not it at all', new_password: 'a brand new password' },
    });
    t.equal(wrong.status, 422);
    t.ok(wrong.body.details.current_password);
    const changed = await http.post('/api/auth/password', {
      token: key,
      body: { current_password: PASSWORD, new_password: 'a brand new password' },
    });
    t.equal(changed.status, 200);
    t.same(changed.body, { sessions_invalidated: 1, api_keys_revoked: 0 });
    t.equal((await http.get('/api/auth/me', { cookie })).status, 401, 'the browser session is signed out');
    t.equal((await http.get('/api/auth/me', { token: key })).status, 200, 'the API key still works');
    t.equal((await http.post('/api/auth/token', { body: { email, password: PASSWORD } })).status, 401);
    t.equal((await http.post('/api/auth/token', { body: { email, password: 'a brand new password' } })).status, 201);
  });

  t.test('forgot never reveals an address; reset works once and signs out every session', async (t) => {
    const { email, key } = await signUp(svc);
    const login = await http.post('/api/auth/login', { body: { email, password: PASSWORD } });
    const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0] as string;
    const known = await http.post('/api/auth/forgot', { body: { email } });
    const unknown = await http.post('/api/auth/forgot', { body: { email: uniqueEmail('ghost') } });
    t.equal(known.status, 200);
    t.same(known.body, unknown.body, 'same answer for a known and an unknown address');
    const mail = await waitForMail(svc.mailDir, email, /reset/i);
    const token = tokenFrom(mail);

    const weak = await http.post('/api/auth/reset', { body: { token, password: 'short' } });
    t.equal(weak.status, 422);
    const reset = await http.post('/api/auth/reset', { body: { token, password: 'reset password 123' } });
    t.equal(reset.status, 200);
    const twice = await http.post('/api/auth/reset', { body: { token, password: 'reset password 456' } });
    t.equal(twice.status, 422);
    t.equal(twice.body.error, 'invalid_token', 'a reset token works once');
    t.equal((await http.get('/api/auth/me', { cookie })).status, 401, 'sessions are signed out');
    t.equal((await http.get('/api/auth/me', { token: key })).status, 200, 'plain API keys stay');
    t.equal((await http.post('/api/auth/token', { body: { email, password: 'reset password 123' } })).status, 201);
  });

  t.test('an expired reset token is 422 expired', async (t) => {
    const { email, accountId } = await signUp(svc);
    await http.post('/api/auth/forgot', { body: { email } });
    const token = tokenFrom(await waitForMail(svc.mailDir, email, /reset/i));
    await svc.db.sql`UPDATE auth_tokens SET expires_at = now() - interval '1 second'
                     WHERE account_id = ${accountId} AND purpose = 'reset'`;
    const r = await http.post('/api/auth/reset', { body: { token, password: 'reset password 123' } });
    t.equal(r.status, 422);
    t.equal(r.body.error, 'expired');
  });

  t.test('an email change answers the same for a free or taken address and confirms by link', async (t) => {
    const a = await signUp(svc);
    const b = await signUp(svc);
    const taken = await http.post('/api/auth/email', {
      token: a.key,
      body: { new_email: b.email, current_password: PASSWORD },
    });
    const fresh = uniqueEmail('moved');
    const free = await http.post('/api/auth/email', {
      token: a.key,
      body: { new_email: fresh, current_password: PASSWORD },
    });
    t.equal(taken.status, 200);
    t.same(taken.body, free.body);
    const wrongPw = await http.post('/api/auth/email', {
      token: a.key,
      body: { new_email: fresh, current_password: 'nope nope' },
    });
    t.equal(wrongPw.status, 422);

    const mail = await waitForMail(svc.mailDir, fresh, /confirm/i);
    const confirm = await http.post('/api/auth/email/confirm', { body: { token: tokenFrom(mail) } });
    t.equal(confirm.status, 200);
    t.equal(confirm.body.email, fresh);
    const me = await http.get('/api/auth/me', { token: a.key });
    t.equal(me.body.email, fresh);
    t.equal((await http.post('/api/auth/token', { body: { email: fresh, password: PASSWORD } })).status, 201);
    t.equal((await http.post('/api/auth/token', { body: { email: a.email, password: PASSWORD } })).status, 401);
  });

  t.test('a sandbox token is actor sprite and reaches only routes meant for it', async (t) => {
    const { accountId } = await signUp(svc);
    const { issueSandboxToken } = await import('../../gateway/src/services/credentials.ts');
    const sprite = await issueSandboxToken(svc.db.sql, accountId, 'conv_test');
    const me = await http.get('/api/auth/me', { token: sprite.key });
    t.equal(me.status, 200);
    t.equal(me.body.actor, 'sprite');
    const creds = await http.get('/api/account/inference-credentials', { token: sprite.key });
    t.equal(creds.status, 403, 'a sandbox token cannot read account credentials');
    const keys = await http.get('/api/auth/api-keys', { token: sprite.key });
    t.equal(keys.status, 403);
  });

  t.test('onboarding completes once and stays complete', async (t) => {
    const { key } = await signUp(svc);
    const before = await http.get('/api/account/onboarding', { token: key });
    t.same(before.body, { state: 'new', completed: false, completed_at: null });
    const first = await http.post('/api/account/onboarding/complete', { token: key });
    t.equal(first.body.completed, true);
    const second = await http.post('/api/account/onboarding/complete', { token: key });
    t.equal(second.body.completed_at, first.body.completed_at, 'idempotent');
    const me = await http.get('/api/auth/me', { token: key });
    t.equal(me.body.onboarding_completed, true);
  });

  t.test('ADMIN_EMAILS addresses register as admin', async (t) => {
    const admin = uniqueEmail('admin');
    const svc2 = await startTestService(t, {
      backend: 'embedded',
      env: { ADMIN_EMAILS: `other@x.io, ${admin.toUpperCase()}` },
    });
    const { key } = await signUp(svc2, admin);
    const me = await svc2.http.get('/api/auth/me', { token: key });
    t.equal(me.body.role, 'admin');
  });
});
