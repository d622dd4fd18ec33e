import { AdminUser, ErrorBody, IdParam } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { compAccount, grantCredit } from '../../services/billing.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['admin'];
const DISABLED =
  'Admins only (role `admin`, full-scope key or session). With payment off, 404 `not_found` with `billing: "disabled"`; 404 `not_found` for an unknown user.';
const Disabled = ErrorBody.extend({ billing: z.literal('disabled').optional() });

/** The operator's billing routes: comp an account, grant credit. */
export function billingAdminRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const r = app.withTypeProvider<ZodTypeProvider>();

  r.post('/api/admin/users/:id/comp', {
    config: { auth: 'admin' },
    schema: {
      tags,
      summary: 'Comp an account (free: never charged, never refused for credit), or end it',
      operationId: 'adminCompUser',
      description: `Answers the admin user row; written to the privilege trail (\`admin.user.comp\`). ${DISABLED}`,
      params: IdParam,
      body: z.object({ comped: z.boolean() }),
      response: { 200: AdminUser, 404: Disabled },
    },
    handler: async (req) =>
      compAccount(deps.sql, deps.billing, actorOf(requirePrincipal(req)), req.params.id, req.body.comped),
  });

  r.post('/api/admin/users/:id/credits', {
    config: { auth: 'admin' },
    schema: {
      tags,
      summary: 'Grant credit to an account',
      operationId: 'adminGrantCredits',
      description: `Appends a grant to the account's credit ledger; negative \`cents\` take credit back. Answers the balance after it; written to the privilege trail (\`admin.user.credits\`, with the cents, never the note). ${DISABLED}`,
      params: IdParam,
      body: z.object({
        cents: z.int().refine((n) => n !== 0, 'must not be zero'),
        note: z.string().min(1).max(500),
      }),
      response: { 200: z.object({ id: z.string(), balance_cents: z.int() }), 404: Disabled },
    },
    handler: async (req) =>
      grantCredit(deps.sql, deps.billing, actorOf(requirePrincipal(req)), req.params.id, req.body),
  });
}
