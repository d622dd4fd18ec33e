import { ApiError, Password } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import * as accounts from '../../services/accounts.ts';
import type { ApiDeps } from '../deps.ts';
import { esc, page } from '../html.ts';

/**
 * Targets of the mailed links (`/verify-email`, `/reset-password`, `/confirm-email`), so a
 * link opened in a browser works without a console app. GET shows a form holding the token;
 * POST performs the same service call as the JSON route and shows the outcome. A token is
 * never used by GET, so mail scanners that prefetch links cannot spend it.
 */
const pages = {
  'verify-email': { title: 'Verify your email address', button: 'Verify', needsPassword: false },
  'reset-password': { title: 'Choose a new password', button: 'Set password', needsPassword: true },
  'confirm-email': { title: 'Confirm your new email address', button: 'Confirm', needsPassword: false },
} as const;

const TokenQuery = z.object({ token: z.string().max(512).optional() });
const PageForm = z.object({ token: z.string().max(512), password: z.string().max(256).optional() });

export function linkPages(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();
  for (const [path, p] of Object.entries(pages)) {
    r.get(`/${path}`, {
      config: { auth: 'public' },
      schema: {
        tags: ['pages'],
        summary: `Browser page: ${p.title.toLowerCase()}`,
        description:
          "The HTML page a mailed link opens: a form carrying the link's `token`, posted back to the same path. For people; programs call the JSON route instead.",
        operationId: `show${pascal(path)}Page`,
        security: [],
        querystring: TokenQuery,
      },
      handler: async (req, reply) => {
        const token = req.query.token ?? '';
        const field = p.needsPassword
          ? '<label>New password (at least 10 characters)<input name="password" type="password" autocomplete="new-password" minlength="10" required></label>'
          : '';
        return page(
          reply,
          200,
          p.title,
          `<form method="post" action="/${path}"><input type="hidden" name="token" value="${esc(token)}">${field}<button>${p.button}</button></form>`,
        );
      },
    });

    r.post(`/${path}`, {
      config: { auth: 'public' },
      schema: {
        tags: ['pages'],
        summary: `Browser form target: ${p.title.toLowerCase()}`,
        description:
          "Takes the page's form and answers an HTML page saying what happened; an unknown, used or expired link answers 422 with a page saying so.",
        operationId: `submit${pascal(path)}Page`,
        security: [],
        consumes: ['application/x-www-form-urlencoded'],
        body: PageForm,
      },
      handler: async (req, reply) => {
        const { token, password } = req.body;
        try {
          if (path === 'verify-email') {
            const done = await accounts.verifyEmail(deps.accounts, token, req.clientIp);
            return page(reply, 200, 'Email verified', `<p>${esc(done.email)} is verified. You can sign in now.</p>`);
          }
          if (path === 'reset-password') {
            const parsed = Password.safeParse(password ?? '');
            if (!parsed.success) {
              return page(
                reply,
                422,
                'Choose a new password',
                '<p>The password must be at least 10 characters. Go back and try again.</p>',
              );
            }
            await accounts.resetPassword(deps.accounts, token, parsed.data, req.clientIp);
            return page(
              reply,
              200,
              'Password changed',
              '<p>Your password is changed and every session was signed out.</p>',
            );
          }
          const done = await accounts.confirmEmailChange(deps.accounts, token, req.clientIp);
          return page(reply, 200, 'Email changed', `<p>Your account's address is now ${esc(done.email)}.</p>`);
        } catch (err) {
          if (!(err instanceof ApiError) || err.status !== 422) throw err;
          const why = err.code === 'expired' ? 'This link has expired. Ask for a new one.' : esc(err.message);
          return page(reply, 422, 'This link does not work', `<p>${why}</p>`);
        }
      },
    });
  }
}

/** `verify-email` as `VerifyEmail`, for operationIds. */
function pascal(path: string): string {
  return path
    .split('-')
    .map((w) => w.charAt(0).toUpperCase() + w.slice(1))
    .join('');
}
