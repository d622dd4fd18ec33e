import t from 'tap';
import { PASSWORD, signUp, startTestService, uniqueEmail, waitForMail } from './harness.ts';

/** Follows a mailed link like a browser: GET the page, submit its form. */
async function followLink(link: string, extra: Record<string, string> = {}) {
  const get = await fetch(link);
  const html = await get.text();
  const token = /name="token" value="([^"]*)"/.exec(html)?.[1] ?? '';
  const action = new URL(/action="([^"]+)"/.exec(html)?.[1] ?? '/', link);
  const post = await fetch(action, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ token, ...extra }).toString(),
  });
  return { get, html, post, result: await post.text() };
}

const linkIn = (text: string) => /(http\S+\?token=[A-Za-z0-9_-]+)/.exec(text)?.[1] as string;

t.test('mailed links open working pages in a browser', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded' });

  t.test('the verification link verifies, and opening it does not spend the token', async (t) => {
    const email = uniqueEmail();
    await svc.http.post('/api/auth/register', { body: { email, password: PASSWORD } });
    const link = linkIn((await waitForMail(svc.mailDir, email, /verify/i)).text);
    t.ok(link.startsWith(`${svc.url}/verify-email?token=`));
    await fetch(link); // a mail scanner prefetching the link
    const { get, html, post, result } = await followLink(link);
    t.equal(get.status, 200);
    t.match(get.headers.get('content-security-policy') ?? '', /default-src 'none'/);
    t.notMatch(html, /<script/i);
    t.equal(post.status, 200);
    t.match(result, /is verified/);
    t.equal((await svc.http.post('/api/auth/token', { body: { email, password: PASSWORD } })).status, 201);
  });

  t.test('the reset link sets a new password; a short one is refused; a used link says so', async (t) => {
    const { email } = await signUp(svc);
    await svc.http.post('/api/auth/forgot', { body: { email } });
    const link = linkIn((await waitForMail(svc.mailDir, email, /reset/i)).text);
    const short = await followLink(link, { password: 'short' });
    t.equal(short.post.status, 422);
    const ok = await followLink(link, { password: 'a long new password' });
    t.equal(ok.post.status, 200);
    t.match(ok.result, /Password changed/);
    t.equal((await svc.http.post('/api/auth/token', { body: { email, password: 'a long new password' } })).status, 201);
    const again = await followLink(link, { password: 'another long password' });
    t.equal(again.post.status, 422);
    t.match(again.result, /does not work/);
  });

  t.test('the email-change link confirms the new address', async (t) => {
    const { key } = await signUp(svc);
    const fresh = uniqueEmail('new');
    await svc.http.post('/api/auth/email', { token: key, body: { new_email: fresh, current_password: PASSWORD } });
    const link = linkIn((await waitForMail(svc.mailDir, fresh, /confirm/i)).text);
    const { post, result } = await followLink(link);
    t.equal(post.status, 200);
    t.match(result, new RegExp(fresh.replace(/[.+]/g, '\\$&')));
  });

  t.test('logout is audited', async (t) => {
    const { email, key } = await signUp(svc);
    const login = await svc.http.post('/api/auth/login', { body: { email, password: PASSWORD } });
    const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0] as string;
    await svc.http.post('/api/auth/logout', { cookie });
    const audit = await svc.http.get('/api/audit?action_prefix=session.', { token: key });
    t.same(
      audit.body.data.map((r: { action: string; actor: string }) => [r.action, r.actor]),
      [
        ['session.ended', 'ui'],
        ['session.created', 'ui'],
      ],
    );
  });
});

t.test('ADMIN_EMAILS promotes an existing account at the next start', async (t) => {
  const first = await startTestService(t, { backend: 'embedded', env: { DATABASE_URL: '' } });
  const user = await signUp(first);
  t.equal((await first.http.get('/api/auth/me', { token: user.key })).body.role, 'user');
  await first.close();
  const second = await startTestService(t, {
    backend: 'embedded',
    env: {
      DATABASE_URL: '',
      DATA_DIR: first.dataDir,
      MASTER_KEY: first.config.MASTER_KEY as string,
      ADMIN_EMAILS: user.email,
    },
  });
  t.equal((await second.http.get('/api/auth/me', { token: user.key })).body.role, 'admin');
});
