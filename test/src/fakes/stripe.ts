/**
 * A local stand-in for Stripe's REST API, Checkout Sessions only (`POST
 * /v1/checkout/sessions`), speaking its wire format: form-encoded bodies with bracketed keys
 * (`line_items[0][price_data][unit_amount]`), the secret key as `Authorization: Bearer
 * <key>` (or HTTP Basic with the key as user name), Stripe's JSON error bodies `{error:
 * {type, code?, param?, message}}` for a missing or bad key (401) and a missing parameter
 * (400), and on success 200 with the Checkout Session object (`id` `cs_test_...`, `url`,
 * `status: open`, `payment_status: unpaid`, `metadata`, ...).
 *
 * It also plays Stripe's webhook sender: `pay(sessionId, url)` marks a session paid and
 * POSTs a `checkout.session.completed` event to `url`, signed as Stripe signs
 * (`Stripe-Signature: t=<unix seconds>,v1=<HMAC-SHA256 of "<t>.<body>">`); `deliver` sends an
 * event again (Stripe redelivers the same event id) or with another secret or timestamp.
 */
import { createHmac, randomBytes } from 'node:crypto';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface FakeSession {
  id: string;
  object: 'checkout.session';
  url: string;
  mode: string;
  status: 'open' | 'complete';
  payment_status: 'unpaid' | 'paid';
  client_reference_id: string | null;
  metadata: Record<string, string>;
  success_url: string;
  cancel_url: string | null;
  amount_total: number;
  currency: string;
  /** Every form field as sent, for assertions on the wire format. */
  form: Record<string, string>;
}

export interface StripeEvent {
  id: string;
  object: 'event';
  type: string;
  created: number;
  livemode: false;
  api_version: string;
  data: { object: unknown };
}

export interface Delivery {
  status: number;
  body: unknown;
}

export interface FakeStripe {
  url: string;
  sessions: FakeSession[];
  /** Requests answered, including refused ones. */
  requests: number;
  /** Marks the session paid and delivers its signed `checkout.session.completed` event to `url`. */
  pay(sessionId: string, url: string): Promise<{ event: StripeEvent; delivery: Delivery }>;
  /** Delivers `event` to `url`, signed with the webhook secret unless `secret` replaces it. */
  deliver(url: string, event: StripeEvent, options?: { secret?: string; timestamp?: number }): Promise<Delivery>;
  close(): Promise<void>;
}

const id = (prefix: string) => `${prefix}_${randomBytes(12).toString('hex')}`;

export async function startFakeStripe(options: { secretKey: string; webhookSecret: string }): Promise<FakeStripe> {
  const sessions: FakeSession[] = [];
  let requests = 0;
  const json = (res: ServerResponse, status: number, body: unknown) => {
    res.writeHead(status, { 'content-type': 'application/json', 'request-id': id('req') });
    res.end(JSON.stringify(body));
  };
  const fail = (res: ServerResponse, status: number, error: Record<string, string>) =>
    json(res, status, { error: { type: 'invalid_request_error', ...error } });

  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      requests++;
      const auth = req.headers.authorization ?? '';
      const bearer = /^Bearer (.+)$/.exec(auth)?.[1];
      const basic = /^Basic (.+)$/.exec(auth)?.[1];
      const key = bearer ?? (basic ? Buffer.from(basic, 'base64').toString().split(':')[0] : undefined);
      if (!key) {
        return fail(res, 401, {
          message:
            "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
        });
      }
      if (key !== options.secretKey) {
        return fail(res, 401, { code: 'api_key_invalid', message: `Invalid API Key provided: ${key.slice(0, 8)}****` });
      }
      if (req.method !== 'POST' || req.url !== '/v1/checkout/sessions') {
        return fail(res, 404, { message: `Unrecognized request URL (${req.method}: ${req.url}).` });
      }
      if (!String(req.headers['content-type']).startsWith('application/x-www-form-urlencoded')) {
        return fail(res, 400, { message: 'Invalid request: the body must be application/x-www-form-urlencoded.' });
      }
      const form = Object.fromEntries(new URLSearchParams(Buffer.concat(chunks).toString('utf8')));
      for (const param of ['mode', 'success_url', 'line_items[0][price_data][currency]']) {
        if (!form[param]) {
          return fail(res, 400, { code: 'parameter_missing', param, message: `Missing required param: ${param}.` });
        }
      }
      const unitAmount = Number(form['line_items[0][price_data][unit_amount]']);
      const quantity = Number(form['line_items[0][quantity]'] ?? '1');
      if (!Number.isInteger(unitAmount) || unitAmount < 0) {
        return fail(res, 400, {
          code: 'parameter_invalid_integer',
          param: 'line_items[0][price_data][unit_amount]',
          message: 'Invalid integer: line_items[0][price_data][unit_amount]',
        });
      }
      const metadata: Record<string, string> = {};
      for (const [k, v] of Object.entries(form)) {
        const m = /^metadata\[(.+)\]$/.exec(k);
        if (m?.[1]) metadata[m[1]] = v;
      }
      const sessionId = id('cs_test');
      const session: FakeSession = {
        id: sessionId,
        object: 'checkout.session',
        url: `https://checkout.stripe.com/c/pay/${sessionId}`,
        mode: form.mode as string,
        status: 'open',
        payment_status: 'unpaid',
        client_reference_id: form.client_reference_id ?? null,
        metadata,
        success_url: form.success_url as string,
        cancel_url: form.cancel_url ?? null,
        amount_total: unitAmount * quantity,
        currency: form['line_items[0][price_data][currency]'] as string,
        form,
      };
      sessions.push(session);
      const { form: _form, ...wire } = session;
      return json(res, 200, wire);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;

  const deliver: FakeStripe['deliver'] = async (url, event, o = {}) => {
    const payload = JSON.stringify(event, null, 2);
    const t = o.timestamp ?? Math.floor(Date.now() / 1000);
    const v1 = createHmac('sha256', o.secret ?? options.webhookSecret)
      .update(`${t}.${payload}`)
      .digest('hex');
    const res = await fetch(url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json; charset=utf-8',
        'user-agent': 'Stripe/1.0 (+https://stripe.com/docs/webhooks)',
        'stripe-signature': `t=${t},v1=${v1}`,
      },
      body: payload,
    });
    const text = await res.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {}
    return { status: res.status, body };
  };

  return {
    url: `http://127.0.0.1:${port}`,
    sessions,
    get requests() {
      return requests;
    },
    async pay(sessionId, url) {
      const session = sessions.find((s) => s.id === sessionId);
      if (!session) throw new Error(`no session ${sessionId}`);
      session.status = 'complete';
      session.payment_status = 'paid';
      const { form: _form, ...object } = session;
      const event: StripeEvent = {
        id: id('evt'),
        object: 'event',
        type: 'checkout.session.completed',
        created: Math.floor(Date.now() / 1000),
        livemode: false,
        api_version: '2024-06-20',
        data: { object },
      };
      return { event, delivery: await deliver(url, event) };
    },
    deliver,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
