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
const errors = { 400: ErrorBody, 401: ErrorBody, 403: ErrorBody, 422: ErrorBody, 429: ErrorBody };

export function authRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  const secureCookie = () => deps.publicUrl().startsWith('https://');

  r.post('/api/auth/register', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Register an account; a verification link is mailed',
      description: 'Answers the same whether or not the address is already registered.',
      body: Registration,
      response: { 201: Accepted, ...errors },
    },
    handler: async (req, reply) => reply.code(201).send(await accounts.register(deps.accounts, req.body, req.clientIp)),
  });

  r.post('/api/auth/resend-verification', {
    config: { auth: 'public' },
    schema: { tags, summary: 'Mail a new verification link', body: ResendBody, response: { 200: Accepted, ...errors } },
    handler: async (req) => accounts.resendVerification(deps.accounts, req.body.email),
  });

  r.post('/api/auth/verify', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Activate the account with the emailed token; idempotent; issues no session',
      body: TokenBody,
      errors: ['invalid_token', 'expired'],
      response: { 200: z.object({ verified: z.literal(true), email: z.string() }), ...errors },
    },
    handler: async (req) => accounts.verifyEmail(deps.accounts, req.body.token, req.clientIp),
  });

  r.post('/api/auth/token', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Exchange email and password for a fresh full-scope API key',
      body: Credentials,
      errors: ['unauthorized', 'email_not_verified', 'account_suspended'],
      response: { 201: ApiKeyWithSecret, ...errors },
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
      body: Credentials,
      errors: ['unauthorized', 'email_not_verified', 'account_suspended'],
      response: { 200: z.object({ expires_at: z.string() }), ...errors },
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
    schema: { tags, summary: 'End the browser session', response: { 204: z.null() } },
    handler: async (req, reply) => {
      const cookie = req.cookies[SESSION_COOKIE];
      if (cookie) await creds.endSession(deps.sql, cookie, req.clientIp);
      reply.clearCookie(SESSION_COOKIE, { path: '/' });
      return reply.code(204).send(null);
    },
  });

  r.get('/api/auth/me', {
    config: { auth: 'user', sprite: true },
    schema: { tags, summary: 'Who is calling', response: { 200: Identity, 401: ErrorBody } },
    handler: async (req) => accounts.identity(deps.sql, requirePrincipal(req), deps.paymentEnabled),
  });

  r.get('/api/auth/api-keys', {
    config: { auth: 'user' },
    schema: { tags, summary: 'List live API keys (prefix only)', response: { 200: listOf(ApiKey), 401: ErrorBody } },
    handler: async (req) => ({ data: await creds.listApiKeys(deps.sql, requirePrincipal(req).accountId) }),
  });

  r.post('/api/auth/api-keys', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'Create an API key; the plaintext is in this response only',
      description:
        'A standard-scope caller can create standard-scope keys only; a full-scope key needs a full-scope caller.',
      body: ApiKeyCreate.optional(),
      response: { 201: ApiKeyWithSecret, ...errors },
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
      params: IdParam,
      response: { 204: z.null(), 401: ErrorBody, 404: ErrorBody },
    },
    handler: async (req, reply) => {
      await creds.revokeApiKey(deps.sql, requirePrincipal(req), req.params.id);
      return reply.code(204).send(null);
    },
  });

  r.post('/api/auth/forgot', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Mail a password reset link; never reveals whether the address exists',
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
      body: ResetBody,
      errors: ['invalid_token', 'expired'],
      response: { 200: z.object({ reset: z.literal(true) }), ...errors },
    },
    handler: async (req) => accounts.resetPassword(deps.accounts, req.body.token, req.body.password, req.clientIp),
  });

  r.post('/api/auth/password', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Change the password; signs out browser sessions, keeps API keys',
      body: PasswordChange,
      response: { 200: PasswordChanged, ...errors },
    },
    handler: async (req) =>
      accounts.changePassword(deps.accounts, requirePrincipal(req), req.body.current_password, req.body.new_password),
  });

  r.post('/api/auth/email', {
    config: { auth: 'full' },
    schema: {
      tags,
      summary: 'Start an email change: a confirmation link goes to the new address',
      description: 'Answers identically whether the address is free or not.',
      body: EmailChange,
      response: { 200: Accepted, ...errors },
    },
    handler: async (req) =>
      accounts.requestEmailChange(deps.accounts, requirePrincipal(req), req.body.new_email, req.body.current_password),
  });

  r.post('/api/auth/email/confirm', {
    config: { auth: 'public' },
    schema: {
      tags,
      summary: 'Complete a pending email change; signs out every session',
      body: TokenBody,
      errors: ['invalid_token', 'expired'],
      response: { 200: z.object({ email: z.string() }), ...errors },
    },
    handler: async (req) => accounts.confirmEmailChange(deps.accounts, req.body.token, req.clientIp),
  });
}
