import {
  Accepted,
  ApiError,
  ApiKey,
  ApiKeyCreate,
  ApiKeyWithSecret,
  Credentials,
  EmailChange,
  ErrorBody,
  ForgotBody,
  Identity,
  IdParam,
  listOf,
  PasswordChange,
  PasswordChanged,
  Registration,
  ResendBody,
  ResetBody,
  TokenBody,
} from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import * as accounts from '../../services/accounts.ts';
import * as creds from '../../services/credentials.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal, SESSION_COOKIE } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['auth'];

export function authRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const secureCookie = () => deps.publicUrl().startsWith('https://');

  r.post('/api/auth/register', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Register an account; a verification link is mailed',
      operationId: 'register',
      description: 'Answers the same whether or not the address is already registered.',
      body: Registration,
      response: { 201: Accepted },
    },
    handler: async (req, reply) => reply.code(201).send(await accounts.register(deps.accounts, req.body, req.clientIp)),
  });

  r.post('/api/auth/resend-verification', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Mail a new verification link',
      description:
        'Public. Answers the same whether or not the address is registered or already verified, so it reveals nothing; a link is mailed only to an unverified account.',
      operationId: 'resendVerification',
      body: ResendBody,
      response: { 200: Accepted },
    },
    handler: async (req) => accounts.resendVerification(deps.accounts, req.body.email),
  });

  r.post('/api/auth/verify', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Activate the account with the emailed token; idempotent; issues no session',
      description:
        'Takes the `token` from the mailed link. 422 `invalid_token` for an unknown or used token, 422 `expired` past its lifetime. Repeating it for an already verified account answers 200 again. Sign in afterwards with POST /api/auth/token or /api/auth/login.',
      operationId: 'verifyEmail',
      body: TokenBody,
      errors: ['invalid_token', 'expired'],
      response: { 200: z.object({ verified: z.literal(true), email: z.string() }) },
    },
    handler: async (req) => accounts.verifyEmail(deps.accounts, req.body.token, req.clientIp),
  });

  r.post('/api/auth/token', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Exchange email and password for a fresh full-scope API key',
      description:
        'The way a program gets its first key. The plaintext `key` is in this answer only; send it as `Authorization: Bearer <key>`. 401 `unauthorized` for a wrong address or password (the same answer for both), 403 `email_not_verified` before verification, 403 `account_suspended` for a suspended account.',
      operationId: 'createToken',
      body: Credentials,
      errors: ['unauthorized', 'email_not_verified', 'account_suspended'],
      response: { 201: ApiKeyWithSecret },
    },
    handler: async (req, reply) =>
      reply
        .code(201)
        .send(await accounts.exchangePasswordForKey(deps.accounts, req.body.email, req.body.password, req.clientIp)),
  });

  r.post('/api/auth/login', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Sign in the console: sets an HttpOnly session cookie',
      description:
        'For browsers: the `svc_session` cookie (HttpOnly, SameSite=Lax) authenticates later requests from this origin only; programs use POST /api/auth/token instead. Same refusals as /api/auth/token.',
      operationId: 'login',
      body: Credentials,
      errors: ['unauthorized', 'email_not_verified', 'account_suspended'],
      response: { 200: z.object({ expires_at: z.string() }) },
    },
    handler: async (req, reply) => {
      const s = await accounts.login(deps.accounts, req.body.email, req.body.password, req.clientIp);
      reply.setCookie(SESSION_COOKIE, s.secret, {
        httpOnly: true,
        sameSite: 'lax',
        secure: secureCookie(),
        path: '/',
        expires: s.expiresAt,
      });
      return { expires_at: s.expiresAt.toISOString() };
    },
  });

  r.post('/api/auth/logout', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'End the browser session',
      description:
        'Ends the session named by the `svc_session` cookie, if any, and clears the cookie. Always 204; API keys are not affected.',
      operationId: 'logout',
      response: { 204: z.null() },
    },
    handler: async (req, reply) => {
      const cookie = req.cookies[SESSION_COOKIE];
      if (cookie) await creds.endSession(deps, cookie, req.clientIp);
      reply.clearCookie(SESSION_COOKIE, { path: '/' });
      return reply.code(204).send(null);
    },
  });

  r.get('/api/auth/me', {
    config: { auth: 'user', sprite: true },
    schema: {
      tags,
      summary: 'Who is calling',
      description:
        'The account behind the credential and how the request authenticated (`actor`: ui, api or sprite; `scope`). `brokered` is true for every account while the instance runs the egress credential broker (EGRESS_BROKER), false otherwise.',
      operationId: 'getMe',
      response: { 200: Identity, 401: ErrorBody },
    },
    handler: async (req) =>
      accounts.identity(deps.sql, requirePrincipal(req), {
        paymentEnabled: deps.paymentEnabled,
        brokerOn: deps.config.EGRESS_BROKER === 'on',
      }),
  });

  r.get('/api/auth/api-keys', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'List live API keys (prefix only)',
      description:
        "Each key's name, prefix, scope, creation and last use; the secret itself is never shown again after creation.",
      operationId: 'listApiKeys',
      response: { 200: listOf(ApiKey), 401: ErrorBody },
    },
    handler: async (req) => ({ data: await creds.listApiKeys(deps.sql, requirePrincipal(req).accountId) }),
  });

  r.post('/api/auth/api-keys', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'Create an API key; the plaintext is in this response only',
      operationId: 'createApiKey',
      description:
        'A standard-scope caller can create standard-scope keys only; a full-scope key needs a full-scope caller.',
      body: ApiKeyCreate.optional(),
      response: { 201: ApiKeyWithSecret },
    },
    handler: async (req, reply) => {
      const p = requirePrincipal(req);
      const body = req.body ?? ApiKeyCreate.parse({});
      if (body.scope === 'full' && p.scope !== 'full') {
        throw new ApiError('forbidden', 'A full-scope key can only be made with a full-scope credential.');
      }
      const key = await creds.createApiKey(deps.sql, actorOf(p), {
        name: body.name,
        scope: body.scope,
        expiresInDays: body.expires_in_days,
      });
      return reply.code(201).send(key);
    },
  });

  r.delete('/api/auth/api-keys/:id', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'Revoke an API key',
      description:
        "The key stops working at once. 404 for an unknown key or another account's; 403 `forbidden` when a standard-scope key names a full-scope one.",
      operationId: 'deleteApiKey',
      params: IdParam,
      response: { 204: z.null(), 401: ErrorBody, 403: ErrorBody, 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await creds.revokeApiKey(deps, requirePrincipal(req), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.post('/api/auth/forgot', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Mail a password reset link; never reveals whether the address exists',
      description: 'Public. Always answers the same; a link is mailed only when the address belongs to an account.',
      operationId: 'forgotPassword',
      body: ForgotBody,
      response: { 200: Accepted, 400: ErrorBody, 422: ErrorBody },
    },
    handler: async (req) => accounts.forgotPassword(deps.accounts, req.body.email, req.clientIp),
  });

  r.post('/api/auth/reset', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Set a new password with the emailed token; signs out every session',
      description:
        'Takes the `token` from the mailed link and the new password. 422 `invalid_token` for an unknown or used token, 422 `expired` past its lifetime. It also marks the address verified: the link proved control of the inbox.',
      operationId: 'resetPassword',
      body: ResetBody,
      errors: ['invalid_token', 'expired'],
      response: { 200: z.object({ reset: z.literal(true) }) },
    },
    handler: async (req) => accounts.resetPassword(deps.accounts, req.body.token, req.body.password, req.clientIp),
  });

  r.post('/api/auth/password', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Change the password; signs out browser sessions, keeps API keys',
      description:
        'Needs a full-scope credential and the current password (422 `validation_failed` on `current_password` when it is wrong).',
      operationId: 'changePassword',
      body: PasswordChange,
      response: { 200: PasswordChanged },
    },
    handler: async (req) =>
      accounts.changePassword(deps.accounts, requirePrincipal(req), req.body.current_password, req.body.new_password),
  });

  r.post('/api/auth/email', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Start an email change: a confirmation link goes to the new address',
      operationId: 'changeEmail',
      description: 'Answers identically whether the address is free or not.',
      body: EmailChange,
      response: { 200: Accepted },
    },
    handler: async (req) =>
      accounts.requestEmailChange(deps.accounts, requirePrincipal(req), req.body.new_email, req.body.current_password),
  });

  r.post('/api/auth/email/confirm', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Complete a pending email change; signs out every session',
      description:
        'Takes the `token` from the link mailed to the new address. 422 `invalid_token` for an unknown or used token, or when the address was taken meanwhile; 422 `expired` past its lifetime.',
      operationId: 'confirmEmailChange',
      body: TokenBody,
      errors: ['invalid_token', 'expired'],
      response: { 200: z.object({ email: z.string() }) },
    },
    handler: async (req) => accounts.confirmEmailChange(deps.accounts, req.body.token, req.clientIp),
  });
}
