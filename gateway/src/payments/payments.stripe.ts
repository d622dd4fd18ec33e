import { createHmac, timingSafeEqual } from 'node:crypto';
import { request } from 'undici';
import { BadSignature, type PaidCheckout, PaymentProviderError, type Payments } from './payments.ts';

export interface StripeOptions {
  /** The API root, `https://api.stripe.com` (PAYMENT_API_URL). */
  apiUrl: string;
  /** The secret key, sent as a bearer. */
  secretKey: string;
  /** The webhook endpoint's signing secret (`whsec_...`). */
  webhookSecret: string;
  timeoutMs: number;
}

/** How far a webhook's signed timestamp may be from now, as Stripe's own libraries allow. */
export const SIGNATURE_TOLERANCE_S = 300;

/**
 * Stripe through its REST API: `POST /v1/checkout/sessions`, form-encoded with bracketed
 * keys, `mode=payment`, one inline-priced line item, the account in `client_reference_id` and
 * `metadata` (with the credit the pack adds, so the webhook credits what was sold, whatever
 * the configuration says by then). Webhooks are verified as Stripe signs them:
 * `Stripe-Signature: t=<unix seconds>,v1=<hex>` where v1 is HMAC-SHA256 of `<t>.<body>` with
 * the signing secret; any v1 may match (Stripe sends several while a secret is rolled).
 */
export function stripePayments(options: StripeOptions): Payments {
  const base = options.apiUrl.replace(/\/$/, '');
  return {
    async checkout({ accountId, pack, successUrl, cancelUrl }) {
      const form = new URLSearchParams({
        mode: 'payment',
        success_url: successUrl,
        cancel_url: cancelUrl,
        client_reference_id: accountId,
        'metadata[account_id]': accountId,
        'metadata[credit_cents]': String(pack.creditCents),
        'line_items[0][quantity]': '1',
        'line_items[0][price_data][currency]': pack.currency,
        'line_items[0][price_data][unit_amount]': String(pack.priceCents),
        'line_items[0][price_data][product_data][name]': `Credit pack (${pack.creditCents} cents of credit)`,
      });
      let res: Awaited<ReturnType<typeof request>>;
      try {
        res = await request(`${base}/v1/checkout/sessions`, {
          method: 'POST',
          headers: {
            authorization: `Bearer ${options.secretKey}`,
            'content-type': 'application/x-www-form-urlencoded',
          },
          body: form.toString(),
          signal: AbortSignal.timeout(options.timeoutMs),
          headersTimeout: options.timeoutMs,
          bodyTimeout: options.timeoutMs,
        });
      } catch (err) {
        const e = err as Error & { code?: string };
        throw new PaymentProviderError(`The payment provider could not be reached (${e.code ?? e.name}).`);
      }
      const body = (await res.body.json().catch(() => undefined)) as
        | { url?: unknown; error?: { message?: unknown } }
        | undefined;
      if (res.statusCode === 200 && typeof body?.url === 'string') return { url: body.url };
      const detail = typeof body?.error?.message === 'string' ? `: ${body.error.message.slice(0, 300)}` : '';
      throw new PaymentProviderError(`The payment provider answered ${res.statusCode}${detail}.`);
    },

    paidCheckout(payload, signatureHeader, now) {
      verifySignature(payload, signatureHeader, options.webhookSecret, now);
      const event = JSON.parse(payload) as {
        id?: unknown;
        type?: unknown;
        data?: { object?: StripeCheckoutSession };
      };
      const paidTypes = ['checkout.session.completed', 'checkout.session.async_payment_succeeded'];
      if (typeof event.id !== 'string' || !paidTypes.includes(String(event.type))) return null;
      const session = event.data?.object;
      // A completed session with a delayed payment method is `unpaid` until async_payment_succeeded.
      if (session?.payment_status !== 'paid') return null;
      const accountId = session.metadata?.account_id ?? session.client_reference_id;
      const creditCents = Number(session.metadata?.credit_cents);
      if (typeof accountId !== 'string' || !Number.isSafeInteger(creditCents) || creditCents <= 0) return null;
      const paid: PaidCheckout = { eventId: event.id, accountId, creditCents, reference: String(session.id) };
      return paid;
    },
  };
}

interface StripeCheckoutSession {
  id?: unknown;
  payment_status?: unknown;
  client_reference_id?: unknown;
  metadata?: { account_id?: unknown; credit_cents?: unknown };
}

/** Throws `BadSignature` unless `header` signs `payload` with `secret` within the tolerance. */
export function verifySignature(payload: string, header: string | undefined, secret: string, now: Date): void {
  if (!header) throw new BadSignature('The Stripe-Signature header is missing.');
  const parts = header.split(',').map((p) => p.trim().split('=', 2) as [string, string?]);
  const t = parts.find(([k]) => k === 't')?.[1];
  const signatures = parts.filter(([k, v]) => k === 'v1' && v).map(([, v]) => v as string);
  if (!t || !/^\d+$/.test(t) || signatures.length === 0) {
    throw new BadSignature('The Stripe-Signature header has no timestamp or no v1 signature.');
  }
  if (Math.abs(now.getTime() / 1000 - Number(t)) > SIGNATURE_TOLERANCE_S) {
    throw new BadSignature('The signature timestamp is outside the tolerance.');
  }
  const expected = createHmac('sha256', secret).update(`${t}.${payload}`, 'utf8').digest();
  const matches = signatures.some((s) => {
    const given = Buffer.from(s, 'hex');
    return given.length === expected.length && timingSafeEqual(given, expected);
  });
  if (!matches) throw new BadSignature('No signature matches the payload.');
}
