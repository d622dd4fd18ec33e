import * as oauth from 'oauth4webapi';
import t from 'tap';
import { PASSWORD, signUp, startTestService, tokenFrom, waitForMail } from './harness.ts';

const REDIRECT = 'http://127.0.0.1:9/callback';
const insecure = { [oauth.allowInsecureRequests]: true };

/** Plays the browser: opens the consent page, submits it, returns the redirect Location. */
async function consent(baseUrl: string, authorizeUrl: URL, form: Record<string, string>, cookie?: string) {
  const pageRes = await fetch(authorizeUrl, { headers: cookie ? { cookie } : {} });
  const html = await pageRes.text();
  const hidden = Object.fromEntries(
    [...html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((m) => [
      m[1],
      (m[2] as string).replace(/&amp;/g, '&').replace(/&quot;/g, '"'),
    ]),
  );
  const post = await fetch(`${baseUrl}/oauth/authorize`, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...(cookie ? { cookie } : {}) },
    body: new URLSearchParams({ ...hidden, ...form }).toString(),
  });
  return { page: pageRes, html, post, location: post.headers.get('location') };
}

t.test('OAuth 2.0 authorization code with PKCE, driven by oauth4webapi', async (t) => {
  const svc = await startTestService(t, {
    backend: 'embedded',
    env: { OAUTH_CLIENTS: JSON.stringify({ console: [REDIRECT] }) },
  });
  const { http } = svc;
  const user = await signUp(svc);
  const client: oauth.Client = { client_id: 'console' };

  const discovered = await oauth.processDiscoveryResponse(
    new URL(svc.url),
    await oauth.discoveryRequest(new URL(svc.url), { algorithm: 'oauth2', ...insecure }),
  );
  t.equal(discovered.token_endpoint, `${svc.url}/api/oauth/token`, 'metadata is discoverable (RFC 8414)');
  const as = discovered;

  async function authorizeUrl(challenge: string, state: string, overrides: Record<string, string> = {}) {
    const url = new URL(as.authorization_endpoint as string);
    url.search = new URLSearchParams({
      client_id: 'console',
      redirect_uri: REDIRECT,
      response_type: 'code',
      code_challenge: challenge,
      code_challenge_method: 'S256',
      state,
      ...overrides,
    }).toString();
    return url;
  }

  /** Signs in on the consent page with email and password; answers the callback parameters. */
  async function authorizeWithPassword(email: string) {
    const verifier = oauth.generateRandomCodeVerifier();
    const state = oauth.generateRandomState();
    const { location } = await consent(
      svc.url,
      await authorizeUrl(await oauth.calculatePKCECodeChallenge(verifier), state),
      {
        decision: 'allow',
        email,
        password: PASSWORD,
      },
    );
    return { verifier, params: oauth.validateAuthResponse(as, client, new URL(location as string), state) };
  }

  const exchange = (params: URLSearchParams, verifier: string) =>
    oauth.authorizationCodeGrantRequest(as, client, oauth.None(), params, REDIRECT, verifier, insecure);

  t.test('a signed-in user consents; the code buys a 30-day full-scope key listed as oauth:console', async (t) => {
    const login = await http.post('/api/auth/login', { body: { email: user.email, password: PASSWORD } });
    const cookie = (login.headers.get('set-cookie') ?? '').split(';')[0] as string;
    const verifier = oauth.generateRandomCodeVerifier();
    const state = oauth.generateRandomState();
    const { page, html, post, location } = await consent(
      svc.url,
      await authorizeUrl(await oauth.calculatePKCECodeChallenge(verifier), state),
      { decision: 'allow' },
      cookie,
    );
    t.equal(page.status, 200);
    t.match(html, /Allow console/);
    t.match(page.headers.get('content-security-policy') ?? '', /frame-ancestors 'none'/);
    t.equal(post.status, 302);
    t.ok(location?.startsWith(`${REDIRECT}?`), 'redirects to the registered URI');

    const params = oauth.validateAuthResponse(as, client, new URL(location as string), state);
    const tokens = await oauth.processAuthorizationCodeResponse(as, client, await exchange(params, verifier));
    t.equal(tokens.token_type, 'bearer');
    t.equal(tokens.expires_in, 30 * 86_400);

    const me = await http.get('/api/auth/me', { token: tokens.access_token });
    t.equal(me.status, 200);
    t.equal(me.body.id, user.accountId);
    t.equal(me.body.scope, 'full');
    const keys = await http.get('/api/auth/api-keys', { token: user.key });
    const listed = keys.body.data.find((k: { name: string }) => k.name === 'oauth:console');
    t.ok(listed, 'listed as oauth:<client_id>');
    const days = (Date.parse(listed.expires_at) - Date.now()) / 86_400_000;
    t.ok(days > 29.9 && days <= 30, 'expires in 30 days');

    t.test('the code works once', async (t) => {
      const replay = await exchange(params, verifier);
      t.equal(replay.status, 400);
      const body = (await replay.json()) as { error: string; error_description: string; message: string };
      t.equal(body.error, 'invalid_grant');
      t.type(body.error_description, 'string');
      t.type(body.message, 'string');
    });

    t.test('revoke (RFC 7009) ends the key', async (t) => {
      const res = await oauth.revocationRequest(as, client, oauth.None(), tokens.access_token, insecure);
      await oauth.processRevocationResponse(res);
      t.equal((await http.get('/api/auth/me', { token: tokens.access_token })).status, 401);
    });
  });

  t.test('a user without a session signs in on the consent page', async (t) => {
    const verifier = oauth.generateRandomCodeVerifier();
    const state = oauth.generateRandomState();
    const url = await authorizeUrl(await oauth.calculatePKCECodeChallenge(verifier), state);
    const wrong = await consent(svc.url, url, { decision: 'allow', email: user.email, password: 'wrong password!' });
    t.equal(wrong.post.status, 401, 'a wrong password shows an error page, no redirect');
    t.equal(wrong.location, null);
    const { location } = await consent(svc.url, url, { decision: 'allow', email: user.email, password: PASSWORD });
    const params = oauth.validateAuthResponse(as, client, new URL(location as string), state);
    const tokens = await oauth.processAuthorizationCodeResponse(as, client, await exchange(params, verifier));
    t.match(tokens.access_token, /^svco_/);
  });

  t.test('a wrong PKCE verifier is invalid_grant', async (t) => {
    const { params } = await authorizeWithPassword(user.email);
    const res = await exchange(params, oauth.generateRandomCodeVerifier());
    t.equal(res.status, 400);
    t.equal(((await res.json()) as { error: string }).error, 'invalid_grant');
  });

  t.test('an expired code is invalid_grant', async (t) => {
    const { params, verifier } = await authorizeWithPassword(user.email);
    await svc.db.sql`UPDATE oauth_codes SET expires_at = now() - interval '1 second' WHERE used_at IS NULL`;
    const res = await exchange(params, verifier);
    t.equal(res.status, 400);
    t.equal(((await res.json()) as { error: string }).error, 'invalid_grant');
  });

  t.test('deny sends access_denied back with the state', async (t) => {
    const state = oauth.generateRandomState();
    const { location } = await consent(
      svc.url,
      await authorizeUrl(await oauth.calculatePKCECodeChallenge(oauth.generateRandomCodeVerifier()), state),
      { decision: 'deny' },
    );
    const url = new URL(location as string);
    t.equal(url.searchParams.get('error'), 'access_denied');
    t.equal(url.searchParams.get('state'), state);
  });

  t.test('an unknown client or unregistered redirect renders an error page and never redirects', async (t) => {
    const challenge = await oauth.calculatePKCECodeChallenge(oauth.generateRandomCodeVerifier());
    const cases: Record<string, string>[] = [
      { client_id: 'stranger' },
      { redirect_uri: 'https://evil.example/cb' },
      { redirect_uri: `${REDIRECT}/x` },
    ];
    for (const overrides of cases) {
      const res = await fetch(await authorizeUrl(challenge, 's', overrides), { redirect: 'manual' });
      t.equal(res.status, 400, JSON.stringify(overrides));
      t.equal(res.headers.get('location'), null);
      t.match(await res.text(), /not valid/);
    }
  });

  t.test('PKCE is required: a missing challenge is sent back as invalid_request', async (t) => {
    const res = await fetch(await authorizeUrl('', 'st', { code_challenge_method: 'plain' }), { redirect: 'manual' });
    t.equal(res.status, 302);
    const url = new URL(res.headers.get('location') as string);
    t.equal(url.searchParams.get('error'), 'invalid_request');
  });

  t.test('the token endpoint takes JSON too and names unsupported grants', async (t) => {
    const res = await http.post('/api/oauth/token', { body: { grant_type: 'password' } });
    t.equal(res.status, 400);
    t.equal(res.body.error, 'unsupported_grant_type');
    const missing = await http.post('/api/oauth/token', { body: { grant_type: 'authorization_code' } });
    t.equal(missing.body.error, 'invalid_grant');
  });

  t.test('a password reset signs out OAuth-issued keys but not plain API keys', async (t) => {
    const other = await signUp(svc);
    const { params, verifier } = await authorizeWithPassword(other.email);
    const tokens = await oauth.processAuthorizationCodeResponse(as, client, await exchange(params, verifier));
    t.equal((await http.get('/api/auth/me', { token: tokens.access_token })).status, 200);
    t.equal((await http.post('/api/auth/forgot', { body: { email: other.email } })).status, 200);
    const token = tokenFrom(await waitForMail(svc.mailDir, other.email, /reset/i));
    t.equal((await http.post('/api/auth/reset', { body: { token, password: 'a reset password 123' } })).status, 200);
    t.equal((await http.get('/api/auth/me', { token: tokens.access_token })).status, 401);
    t.equal((await http.get('/api/auth/me', { token: other.key })).status, 200);
  });
});
