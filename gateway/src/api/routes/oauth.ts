import { createHash } from 'node:crypto';
import { ApiError, ErrorBody } from '@svc/core';
import type { FastifyInstance, FastifyReply } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { checkPassword } from '../../services/accounts.ts';
import { authenticateBearer, authenticateSession, revokePresentedKey } from '../../services/credentials.ts';
import { type AuthorizeParams, checkAuthorizeRequest, exchangeCode, issueCode } from '../../services/oauth.ts';
import { SESSION_COOKIE } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';
import { esc, page } from '../html.ts';

const tags = ['oauth'];

const AuthorizeQuery = z.object({
  client_id: z.string().max(200).optional(),
  redirect_uri: z.string().max(2000).optional(),
  code_challenge: z.string().max(200).optional(),
  code_challenge_method: z.string().max(20).optional(),
  state: z.string().max(2000).optional(),
  response_type: z.string().max(50).optional(),
});

const AuthorizeForm = AuthorizeQuery.extend({
  decision: z.enum(['allow', 'deny']),
  csrf: z.string().max(200).optional(),
  email: z.string().max(254).optional(),
  password: z.string().max(256).optional(),
});

const TokenRequest = z.object({
  grant_type: z.string().max(100).optional(),
  code: z.string().max(200).optional(),
  code_verifier: z.string().max(200).optional(),
  client_id: z.string().max(200).optional(),
  redirect_uri: z.string().max(2000).optional(),
});

const TokenResponse = z.object({
  access_token: z.string(),
  token_type: z.literal('bearer'),
  expires_in: z.int().meta({ description: 'Seconds: 30 days.' }),
});

const OAuthError = ErrorBody.extend({ error_description: z.string().optional() });

/** The consent form's CSRF value is bound to the session cookie: a page on another site cannot compute it. */
const csrfFor = (cookie: string) => createHash('sha256').update(`csrf:${cookie}`).digest('base64url');

function redirectWith(reply: FastifyReply, redirectUri: string, params: Record<string, string | undefined>) {
  const url = new URL(redirectUri);
  for (const [k, v] of Object.entries(params)) if (v !== undefined) url.searchParams.set(k, v);
  return reply.code(302).header('location', url.toString()).header('cache-control', 'no-store').send();
}

export function oauthRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const clients = deps.config.OAUTH_CLIENTS;

  r.get('/.well-known/oauth-authorization-server', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'OAuth 2.0 authorization server metadata (RFC 8414)',
      description:
        'Public. The issuer and the authorization, token and revocation endpoints of this instance; only the authorization code grant with PKCE S256 and public clients are supported.',
      operationId: 'getOAuthServerMetadata',
      security: [],
      response: { 200: z.record(z.string(), z.unknown()) },
    },
    handler: async () => {
      const base = deps.publicUrl();
      return {
        issuer: base,
        authorization_endpoint: `${base}/oauth/authorize`,
        token_endpoint: `${base}/api/oauth/token`,
        revocation_endpoint: `${base}/api/oauth/revoke`,
        response_types_supported: ['code'],
        grant_types_supported: ['authorization_code'],
        code_challenge_methods_supported: ['S256'],
        token_endpoint_auth_methods_supported: ['none'],
        revocation_endpoint_auth_methods_supported: ['none'],
      };
    },
  });

  r.get('/oauth/authorize', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Browser consent page for the authorization code grant with PKCE (S256)',
      operationId: 'showOAuthConsent',
      description:
        'An unknown client or a redirect URI not registered in OAUTH_CLIENTS renders an error page and never redirects.',
      security: [],
      querystring: AuthorizeQuery,
    },
    handler: async (req, reply) => {
      const q = req.query as AuthorizeParams;
      const check = checkAuthorizeRequest(clients, q);
      if (!check.ok && check.fatal)
        return page(reply, 400, 'This sign-in link is not valid', `<p>${esc(check.message)}</p>`);
      if (!check.ok) {
        return redirectWith(reply, q.redirect_uri as string, {
          error: check.error,
          error_description: check.message,
          state: q.state,
        });
      }
      const cookie = req.cookies[SESSION_COOKIE];
      const session = cookie ? await authenticateSession(deps, cookie, req.clientIp).catch(() => undefined) : undefined;
      const hidden = (['client_id', 'redirect_uri', 'code_challenge', 'code_challenge_method', 'state'] as const)
        .filter((k) => q[k] !== undefined)
        .map((k) => `<input type="hidden" name="${k}" value="${esc(q[k] as string)}">`)
        .join('');
      const credentials =
        session && cookie
          ? `<input type="hidden" name="csrf" value="${csrfFor(cookie)}"><p>You are signed in.</p>`
          : '<label>Email<input name="email" type="email" autocomplete="username" required></label><label>Password<input name="password" type="password" autocomplete="current-password" required></label>';
      return page(
        reply,
        200,
        `Allow ${q.client_id} to use your account?`,
        `<p><b>${esc(q.client_id as string)}</b> will get a key with full access to your account for 30 days.</p>
<form method="post" action="/oauth/authorize">${hidden}${credentials}
<button name="decision" value="allow">Allow</button><button name="decision" value="deny" formnovalidate>Deny</button></form>`,
        q.redirect_uri,
      );
    },
  });

  r.post('/oauth/authorize', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Consent form target: answers 302 to the redirect URI with `code` and `state`',
      description:
        'Posted by the consent page. Allow answers 302 to the redirect URI with `code` and `state`; deny with `error=access_denied`. An unknown client or redirect URI renders an error page instead of redirecting.',
      operationId: 'submitOAuthConsent',
      security: [],
      consumes: ['application/x-www-form-urlencoded'],
      body: AuthorizeForm,
    },
    handler: async (req, reply) => {
      const f = req.body;
      const check = checkAuthorizeRequest(clients, f);
      if (!check.ok && check.fatal)
        return page(reply, 400, 'This sign-in link is not valid', `<p>${esc(check.message)}</p>`);
      if (!check.ok) return redirectWith(reply, f.redirect_uri as string, { error: check.error, state: f.state });
      if (f.decision === 'deny')
        return redirectWith(reply, f.redirect_uri as string, { error: 'access_denied', state: f.state });

      let accountId: string | undefined;
      const cookie = req.cookies[SESSION_COOKIE];
      if (cookie && f.csrf) {
        const session = await authenticateSession(deps, cookie, req.clientIp).catch(() => undefined);
        if (session && f.csrf === csrfFor(cookie)) accountId = session.accountId;
      } else if (f.email && f.password) {
        try {
          accountId = (await checkPassword(deps.sql, f.email.trim().toLowerCase(), f.password)).id;
        } catch {
          accountId = undefined;
        }
      }
      if (!accountId) {
        return page(
          reply,
          401,
          'Could not sign you in',
          '<p>The email or password is wrong, or the page expired. Go back and try again.</p>',
        );
      }
      const code = await issueCode(
        deps.sql,
        accountId,
        {
          client_id: f.client_id as string,
          redirect_uri: f.redirect_uri as string,
          code_challenge: f.code_challenge as string,
        },
        req.clientIp,
      );
      return redirectWith(reply, f.redirect_uri as string, { code, state: f.state });
    },
  });

  r.post('/api/oauth/token', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Exchange an authorization code (with its PKCE verifier) for a full-scope key',
      operationId: 'exchangeOAuthCode',
      description:
        'Form-encoded (RFC 6749) or JSON. The key expires in 30 days and is listed as `oauth:<client_id>`. Errors carry `error_description` beside `message`.',
      security: [],
      consumes: ['application/x-www-form-urlencoded', 'application/json'],
      body: TokenRequest,
      errors: ['invalid_grant', 'unsupported_grant_type'],
      response: { 200: TokenResponse, 400: OAuthError },
    },
    handler: async (req, reply) => {
      reply.header('cache-control', 'no-store');
      return exchangeCode(deps.sql, clients, req.body);
    },
  });

  r.post('/api/oauth/revoke', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Revoke a key (RFC 7009): the `token` field, or else the bearer key presented',
      operationId: 'revokeOAuthToken',
      description: 'Answers 200 whether or not the token was live, as RFC 7009 asks.',
      security: [],
      consumes: ['application/x-www-form-urlencoded', 'application/json'],
      body: z
        .object({ token: z.string().max(300).optional(), token_type_hint: z.string().max(50).optional() })
        .optional(),
      errors: ['unauthorized', 'forbidden'],
      response: { 200: z.object({ revoked: z.literal(true) }), 400: OAuthError, 401: ErrorBody },
    },
    handler: async (req) => {
      let token = req.body?.token;
      if (!token) {
        const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
        if (!m?.[1] || !(await authenticateBearer(deps, m[1], req.clientIp))) {
          throw new ApiError('unauthorized', 'Send the token to revoke, or present it as the bearer.');
        }
        token = m[1];
      }
      await revokePresentedKey(deps, token, req.clientIp);
      return { revoked: true as const };
    },
  });
}
