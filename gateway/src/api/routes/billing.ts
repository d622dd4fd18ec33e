import { BillingState, CheckoutSession, ErrorBody } from '@svc/core';
import type { FastifyInstance } from 'fastify';
import type { ZodTypeProvider } from 'fastify-type-provider-zod';
import { z } from 'zod';
import { billingState, receivePaymentEvent, startCheckout } from '../../services/billing.ts';
import { actorOf } from '../../services/principal.ts';
import { requirePrincipal } from '../auth.ts';
import type { ApiDeps } from '../deps.ts';

const tags = ['billing'];
const DISABLED = 'With payment off (no PAYMENT_PROVIDER_KEY), 404 `not_found` with `billing: "disabled"` in the body.';
const Disabled = ErrorBody.extend({ billing: z.literal('disabled').optional() });

export async function billingRoutes(app: FastifyInstance, deps: ApiDeps): Promise<void> {
  const r = app.withTypeProvider<ZodTypeProvider>();

  r.get('/api/account/billing', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'Credit balance, spending cap and this month’s usage',
      operationId: 'getBilling',
      description: `Balance and cap in cents; usage covers the current calendar month (UTC). A turn is charged its metered time (start to end) at PAYMENT_CENTS_PER_TURN_HOUR when it ends, once, so usage does not match to the cent while turns run. ${DISABLED}`,
      response: { 200: BillingState, 404: Disabled },
    },
    handler: async (req) => billingState(deps.sql, deps.billing, requirePrincipal(req).accountId),
  });

  r.post('/api/account/billing/credits/checkout', {
    config: { auth: 'user' },
    schema: {
      tags,
      summary: 'A checkout page at the payment provider for one credit pack',
      operationId: 'createCreditCheckout',
      description: `Answers a one-time URL of the provider's checkout page for one pack (PAYMENT_CREDIT_PACK_CENTS of credit at PAYMENT_CREDIT_PACK_PRICE_CENTS); the server picks the return pages, callers supply none. The balance moves when the provider's webhook confirms the payment. 422 \`account_comped\` for a comped account; 502 \`network\` when the provider refused or could not be reached. ${DISABLED}`,
      errors: ['account_comped', 'network'],
      response: { 200: CheckoutSession, 404: Disabled },
    },
    handler: async (req) => startCheckout(deps.sql, deps.billing, actorOf(requirePrincipal(req))),
  });

  // The provider signs the exact bytes it sends, so this route reads its body as text.
  await app.register(async (raw) => {
    raw.removeContentTypeParser('application/json');
    raw.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => done(null, body));
    raw.withTypeProvider<ZodTypeProvider>().post('/api/webhooks/stripe', {
      config: { auth: 'public' },
      schema: {
        tags,
        summary: "The payment provider's inbound webhook (Stripe)",
        operationId: 'receivePaymentWebhook',
        security: [],
        description: `Public; called by the payment provider, not by clients. Verified as Stripe signs: \`Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" with PAYMENT_WEBHOOK_SECRET>\`, within 300 s of now; 401 \`unauthorized\` otherwise. \`checkout.session.completed\` (and \`checkout.session.async_payment_succeeded\`) with \`payment_status: paid\` credits the pack sold, once per event id however often it is delivered; other events are acknowledged and ignored. ${DISABLED}`,
        errors: ['unauthorized', 'invalid_request'],
        response: { 200: z.object({ received: z.literal(true), credited: z.boolean() }), 404: Disabled },
      },
      handler: async (req) => {
        const signature = req.headers['stripe-signature'];
        const credited = await receivePaymentEvent(
          deps.sql,
          deps.billing,
          typeof req.body === 'string' ? req.body : '',
          typeof signature === 'string' ? signature : undefined,
        );
        return { received: true as const, credited };
      },
    });
  });
}
