import { createHmac } from 'node:crypto';
import { billing as ledger } from '@svc/db';
import { loadConfig } from '@svc/gateway';
import t, { type Test } from 'tap';
import { type FakeStripe, startFakeStripe } from './fakes/stripe.ts';
import { type Backend, signUp, startTestService, type TestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { until } from './until.ts';

const SECRET_KEY = 'sk_test_billing_0123456789';
const WEBHOOK_SECRET = 'whsec_test_billing_0123456789';
const UPGRADE_URL = 'https://console.example.test/billing';
const ADMIN = 'ops@billing.example.test';
/** More admins, for tests that need one of their own. */
const COMP_ADMIN = 'ops+comp@billing.example.test';
const ERRORS_ADMIN = 'ops+errors@billing.example.test';

/** A rate of one cent per millisecond of turn time, so any turn's charge is visible. */
const CENTS_PER_TURN_HOUR = 3_600_000;

async function paymentOn(t: Test, backend: Backend, fake: FakeStripe, env: Record<string, string> = {}) {
  return startTestService(t, {
    backend,
    env: {
      RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND,
      PAYMENT_PROVIDER_KEY: SECRET_KEY,
      PAYMENT_API_URL: fake.url,
      PAYMENT_WEBHOOK_SECRET: WEBHOOK_SECRET,
      PAYMENT_CREDIT_PACK_CENTS: '2500',
      PAYMENT_CREDIT_PACK_PRICE_CENTS: '2000',
      PAYMENT_CENTS_PER_TURN_HOUR: String(CENTS_PER_TURN_HOUR),
      PAYMENT_UPGRADE_URL: UPGRADE_URL,
      ADMIN_EMAILS: `${ADMIN},${COMP_ADMIN},${ERRORS_ADMIN}`,
      AUTONOMOUS_IDLE_MS: '300',
      ...env,
    },
  });
}

async function turnsOf(svc: TestService, token: string, conversationId: string) {
  return (await svc.http.get(`/api/conversations/${conversationId}/turns`, { token })).body.data as {
    id: string;
    state: string;
    created_at: string;
    ended_at: string | null;
  }[];
}

async function ledgerRows(svc: TestService, accountId: string) {
  return svc.db.sql<{ kind: string; cents: string; turn_id: string | null; turn_ms: string | null }[]>`
    SELECT kind, cents, turn_id, turn_ms FROM credit_ledger WHERE account_id = ${accountId} ORDER BY id`;
}

/**
 * An account with no credit launches a conversation and prompts it again: both turns run to
 * `done`, and the ledger holds no row (payment off, or a comped account).
 */
async function twoTurnsUncharged(t: Test, svc: TestService, me: { key: string; accountId: string }) {
  const { agent } = await claudeAgent(t, svc.http, me.key);
  const started = await svc.http.post('/api/conversations', {
    token: me.key,
    body: { agent_id: agent.id, prompt: 'hello' },
  });
  t.equal(started.status, 201, `a launch with no credit runs: ${started.text}`);
  await until('the turn ends', async () => (await turnsOf(svc, me.key, started.body.id))[0]?.state === 'done');
  const again = await svc.http.post(`/api/conversations/${started.body.id}/prompts`, {
    token: me.key,
    body: { prompt: 'again' },
  });
  t.equal(again.status, 201, again.text);
  await until('the second turn ends', async () =>
    (await turnsOf(svc, me.key, started.body.id)).every((x) => x.state === 'done'),
  );
  t.same(await ledgerRows(svc, me.accountId), [], 'no charge: the ledger holds nothing');
}

/**
 * Billing with payment off and on, on one backend: billing.test.ts runs it on Postgres and
 * Redis, billing-embedded.test.ts on the embedded backend, so each runs in parallel within its
 * own time limit. Payment on starts three services (the main one, a monthly cap, a wrong key).
 */
export function billingScenario(backend: Backend): void {
  t.test(`billing with payment off (${backend})`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, ADMIN_EMAILS: ADMIN },
    });
    const me = await signUp(svc);
    const disabled = { error: 'not_found', message: 'Billing is not enabled on this instance.', billing: 'disabled' };

    t.test('both billing routes and the webhook answer 404 with billing: disabled', async (t) => {
      const state = await svc.http.get('/api/account/billing', { token: me.key });
      t.equal(state.status, 404);
      t.same(state.body, disabled);
      const checkout = await svc.http.post('/api/account/billing/credits/checkout', { token: me.key });
      t.equal(checkout.status, 404);
      t.same(checkout.body, disabled);
      const hook = await svc.http.post('/api/webhooks/stripe', { body: { id: 'evt_1', type: 'ping' } });
      t.equal(hook.status, 404);
      t.same(hook.body, disabled);
      t.equal((await svc.http.get('/api/auth/me', { token: me.key })).body.comped, null, 'comped is null');
      const admin = await signUp(svc, ADMIN);
      const comp = await svc.http.post(`/api/admin/users/${me.accountId}/comp`, {
        token: admin.key,
        body: { comped: true },
      });
      t.equal(comp.status, 404);
      t.same(comp.body, disabled);
      const credits = await svc.http.post(`/api/admin/users/${me.accountId}/credits`, {
        token: admin.key,
        body: { cents: 100, note: 'welcome' },
      });
      t.equal(credits.status, 404);
      t.same(credits.body, disabled);
    });

    t.test('nothing is gated and no turn is charged', async (t) => {
      await twoTurnsUncharged(t, svc, me);
    });
  });

  t.test(`billing with payment on (${backend})`, async (t) => {
    const fake = await startFakeStripe({ secretKey: SECRET_KEY, webhookSecret: WEBHOOK_SECRET });
    t.teardown(() => fake.close());
    const svc = await paymentOn(t, backend, fake);
    const hookUrl = `${svc.url}/api/webhooks/stripe`;

    t.test('at zero balance a launch and a prompt are 402 insufficient_credits with upgrade_url', async (t) => {
      const me = await signUp(svc);
      const { agent } = await claudeAgent(t, svc.http, me.key);
      const state = await svc.http.get('/api/account/billing', { token: me.key });
      t.equal(state.status, 200, state.text);
      t.equal(state.body.balance_cents, 0);
      t.equal(state.body.cap_cents, null);
      t.equal(state.body.comped, false);
      t.equal((await svc.http.get('/api/auth/me', { token: me.key })).body.comped, false, 'comped is a boolean');

      const refused = await svc.http.post('/api/conversations', {
        token: me.key,
        body: { agent_id: agent.id, prompt: 'hello' },
      });
      t.equal(refused.status, 402);
      t.same(refused.body, {
        error: 'insufficient_credits',
        message: 'The account has no credit left; buy a credit pack.',
        upgrade_url: UPGRADE_URL,
      });
      t.same((await svc.http.get('/api/conversations', { token: me.key })).body.data, [], 'nothing was launched');

      // One cent of credit runs one turn, whose charge takes the balance below zero.
      await ledger.grant(svc.db.sql, me.accountId, 1, 'test');
      const started = await svc.http.post('/api/conversations', {
        token: me.key,
        body: { agent_id: agent.id, prompt: 'hello' },
      });
      t.equal(started.status, 201, started.text);
      const balance = await until('the turn is charged', async () => {
        const b = (await svc.http.get('/api/account/billing', { token: me.key })).body.balance_cents as number;
        return b < 1 ? b : undefined;
      });
      t.ok(balance < 0, 'the balance went below zero');
      const prompt = await svc.http.post(`/api/conversations/${started.body.id}/prompts`, {
        token: me.key,
        body: { prompt: 'again' },
      });
      t.equal(prompt.status, 402, prompt.text);
      t.equal(prompt.body.error, 'insufficient_credits');
      t.equal(prompt.body.upgrade_url, UPGRADE_URL);
      t.equal((await turnsOf(svc, me.key, started.body.id)).length, 1, 'no turn was opened');
    });

    t.test('a turn is charged its metered time once, when it ends', async (t) => {
      const me = await signUp(svc);
      const { agent } = await claudeAgent(t, svc.http, me.key);
      await ledger.grant(svc.db.sql, me.accountId, 10_000_000, 'test');
      const started = await svc.http.post('/api/conversations', {
        token: me.key,
        body: { agent_id: agent.id, prompt: 'hello' },
      });
      t.equal(started.status, 201, started.text);
      const turn = await until('the turn ends', async () => {
        const [x] = await turnsOf(svc, me.key, started.body.id);
        return x?.state === 'done' ? x : undefined;
      });
      const charged = await until('the charge is on the ledger', async () =>
        (await ledgerRows(svc, me.accountId)).find((r) => r.kind === 'turn'),
      );
      t.equal(charged.turn_id, turn.id, 'the charge names its turn');
      const [metered] = await svc.db.sql<{ ms: string }[]>`
        SELECT floor(extract(epoch FROM ended_at - created_at) * 1000)::bigint AS ms FROM turns WHERE id = ${turn.id}`;
      t.equal(Number(charged.turn_ms), Number(metered?.ms), 'metered from the turn’s start to its end');
      t.equal(Number(charged.cents), -Math.ceil((Number(metered?.ms) * CENTS_PER_TURN_HOUR) / 3_600_000));

      t.equal(
        await ledger.chargeTurn(svc.db.sql, me.accountId, turn.id, CENTS_PER_TURN_HOUR),
        null,
        'charging the turn again charges nothing',
      );
      t.equal((await ledgerRows(svc, me.accountId)).filter((r) => r.kind === 'turn').length, 1, 'one charge');

      const state = await svc.http.get('/api/account/billing', { token: me.key });
      t.equal(state.body.balance_cents, 10_000_000 + Number(charged.cents));
      t.equal(state.body.usage.conversations, 1);
      t.equal(state.body.usage.credit_burned_cents, -Number(charged.cents));
      t.equal(state.body.usage.month, new Date().toISOString().slice(0, 7));
      t.equal(state.body.usage.turn_hours, Number(metered?.ms) / 3_600_000, 'turn_hours is the metered time');
    });

    t.test('an autonomous turn is charged when it ends, like a person’s', async (t) => {
      const me = await signUp(svc);
      const { agent } = await claudeAgent(t, svc.http, me.key);
      await ledger.grant(svc.db.sql, me.accountId, 10_000_000, 'test');
      // The scripted agent's keyword `background` makes it say more after its answer.
      const started = await svc.http.post('/api/conversations', {
        token: me.key,
        body: { agent_id: agent.id, prompt: 'background please' },
      });
      t.equal(started.status, 201, started.text);
      const turns = await until('the autonomous turn ends', async () => {
        const all = await turnsOf(svc, me.key, started.body.id);
        return all.length === 2 && all.every((x) => x.state !== 'running') ? all : undefined;
      });
      const charged = await until('both turns are charged', async () => {
        const rows = (await ledgerRows(svc, me.accountId)).filter((r) => r.kind === 'turn');
        return rows.length === 2 ? rows : undefined;
      });
      t.same(charged.map((r) => r.turn_id).sort(), turns.map((x) => x.id).sort(), 'one charge per turn');
      const origins = await svc.db.sql<{ origin: string }[]>`
        SELECT origin FROM turns WHERE conversation_id = ${started.body.id} ORDER BY number`;
      t.same(
        origins.map((o) => o.origin),
        ['user', 'autonomous'],
      );
    });

    t.test('a comped account is never gated nor charged, and may not check out', async (t) => {
      const me = await signUp(svc);
      const admin = await signUp(svc, COMP_ADMIN);
      const comp = await svc.http.post(`/api/admin/users/${me.accountId}/comp`, {
        token: admin.key,
        body: { comped: true },
      });
      t.match(comp.body, { id: me.accountId, comped: true }, comp.text);
      await twoTurnsUncharged(t, svc, me);
      const state = await svc.http.get('/api/account/billing', { token: me.key });
      t.equal(state.body.comped, true);
      t.equal(state.body.balance_cents, 0);
      const checkout = await svc.http.post('/api/account/billing/credits/checkout', { token: me.key });
      t.equal(checkout.status, 422);
      t.equal(checkout.body.error, 'account_comped');
    });

    t.test('a checkout session is made at the provider and its paid webhook credits the pack once', async (t) => {
      const me = await signUp(svc);
      const other = await signUp(svc);
      const checkout = await svc.http.post('/api/account/billing/credits/checkout', { token: me.key });
      t.equal(checkout.status, 200, checkout.text);
      const session = fake.sessions.at(-1);
      if (!session) throw new Error('no session at the provider');
      t.equal(checkout.body.url, session.url, 'the answer is the provider’s checkout URL');
      t.equal(session.mode, 'payment');
      t.equal(session.client_reference_id, me.accountId);
      t.same(session.metadata, { account_id: me.accountId, credit_cents: '2500' });
      t.equal(session.amount_total, 2000);
      t.equal(session.currency, 'usd');
      t.ok(session.success_url.startsWith(`${svc.url}/`), `server-chosen success_url ${session.success_url}`);
      t.ok(session.cancel_url?.startsWith(`${svc.url}/`), 'server-chosen cancel_url');

      const balanceOf = async (key: string) =>
        (await svc.http.get('/api/account/billing', { token: key })).body.balance_cents as number;
      const { event, delivery } = await fake.pay(session.id, hookUrl);
      t.same(delivery, { status: 200, body: { received: true, credited: true } });
      t.equal(await balanceOf(me.key), 2500, 'the pack is credited');
      for (let i = 0; i < 3; i++) {
        t.same(await fake.deliver(hookUrl, event), { status: 200, body: { received: true, credited: false } });
      }
      t.equal(await balanceOf(me.key), 2500, 'a redelivered event moves the balance no more');
      t.equal(await balanceOf(other.key), 0, 'another account is untouched');
      const purchases = (await ledgerRows(svc, me.accountId)).filter((r) => r.kind === 'purchase');
      t.equal(purchases.length, 1);
    });

    t.test('a webhook whose signature does not hold is 401 and moves nothing', async (t) => {
      const me = await signUp(svc);
      const checkout = await svc.http.post('/api/account/billing/credits/checkout', { token: me.key });
      t.equal(checkout.status, 200, checkout.text);
      const session = fake.sessions.at(-1);
      if (!session) throw new Error('no session at the provider');
      session.payment_status = 'paid';
      const { form: _form, ...object } = session;
      const event = {
        id: 'evt_forged_1',
        object: 'event' as const,
        type: 'checkout.session.completed',
        created: Math.floor(Date.now() / 1000),
        livemode: false as const,
        api_version: '2024-06-20',
        data: { object },
      };
      const wrong = await fake.deliver(hookUrl, event, { secret: 'whsec_not_the_secret' });
      t.equal(wrong.status, 401);
      t.equal((wrong.body as { error: string }).error, 'unauthorized');
      const stale = await fake.deliver(hookUrl, event, { timestamp: Math.floor(Date.now() / 1000) - 301 });
      t.equal(stale.status, 401, 'a signature older than 300 s is refused');
      const unsigned = await fetch(hookUrl, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(event),
      });
      t.equal(unsigned.status, 401, 'an unsigned event is refused');
      t.same(await ledgerRows(svc, me.accountId), [], 'nothing was credited');
      const right = await fake.deliver(hookUrl, event);
      t.equal(right.status, 200, 'the same event signed with the secret is taken');
    });

    t.test('an admin grants credit; others may not; an unknown user is 404', async (t) => {
      const admin = await signUp(svc, ADMIN);
      const me = await signUp(svc);
      const granted = await svc.http.post(`/api/admin/users/${me.accountId}/credits`, {
        token: admin.key,
        body: { cents: 500, note: 'welcome' },
      });
      t.equal(granted.status, 200, granted.text);
      t.same(granted.body, { id: me.accountId, balance_cents: 500 });
      t.equal((await svc.http.get('/api/account/billing', { token: me.key })).body.balance_cents, 500);
      const self = await svc.http.post(`/api/admin/users/${me.accountId}/credits`, {
        token: me.key,
        body: { cents: 500, note: 'mine' },
      });
      t.equal(self.status, 403, 'a user may not grant credit');
      const unknown = await svc.http.post('/api/admin/users/acc_nobody/credits', {
        token: admin.key,
        body: { cents: 500, note: 'welcome' },
      });
      t.equal(unknown.status, 404);
      t.same(unknown.body, { error: 'not_found', message: 'No account has that id.' });
      t.equal((await svc.http.get('/api/account/billing', { token: me.key })).body.balance_cents, 500, 'unchanged');
      const trail = await svc.http.get('/api/admin/events', { token: admin.key });
      t.equal(trail.status, 200, trail.text);
      t.match(
        trail.body.data.find((e: { action: string }) => e.action === 'admin.user.credits'),
        { admin_id: admin.accountId, action: 'admin.user.credits', target_id: me.accountId, metadata: { cents: 500 } },
        'the grant is on the privilege trail',
      );
    });

    t.test('comp and credits: an unknown id is 404, a user is 403, a bad body is 422 naming the field', async (t) => {
      const me = await signUp(svc);
      const admin = await signUp(svc, ERRORS_ADMIN);
      const post = (path: string, token: string, body: unknown) => svc.http.post(path, { token, body });
      const unknown = await post('/api/admin/users/acc_nobody/comp', admin.key, { comped: true });
      t.equal(unknown.status, 404);
      t.same(unknown.body, { error: 'not_found', message: 'No account has that id.' });
      const byUser = await post(`/api/admin/users/${me.accountId}/comp`, me.key, { comped: true });
      t.equal(byUser.status, 403, 'a user may not comp, even itself');
      t.equal(byUser.body.error, 'forbidden');
      t.equal((await svc.http.get('/api/account/billing', { token: me.key })).body.comped, false, 'not comped');
      const bad: [unknown, string][] = [
        [{ cents: 0, note: 'nothing' }, 'cents'],
        [{ cents: 1.5, note: 'a fraction' }, 'cents'],
        [{ cents: 100 }, 'note'],
        [{ cents: 100, note: '' }, 'note'],
      ];
      for (const [body, field] of bad) {
        const res = await post(`/api/admin/users/${me.accountId}/credits`, admin.key, body);
        t.equal(res.status, 422, JSON.stringify(body));
        t.equal(res.body.error, 'validation_failed');
        t.same(Object.keys(res.body.details), [field], `details name ${field}`);
        t.ok(res.body.details[field].length > 0, 'with a message');
      }
      t.match((await post(`/api/admin/users/${me.accountId}/credits`, admin.key, bad[0]?.[0])).body.details.cents, [
        'must not be zero',
      ]);
      t.same(await ledgerRows(svc, me.accountId), [], 'nothing reached the ledger');
      const trail = await svc.http.get('/api/admin/events?per_page=200', { token: admin.key });
      t.notOk(
        trail.body.data.some((e: { target_id: string }) => e.target_id === me.accountId),
        'nothing refused is on the privilege trail',
      );
    });

    t.test('a signed webhook whose body is not JSON is 400 invalid_request and moves nothing', async (t) => {
      const purchases = async () =>
        (await svc.db.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM credit_ledger WHERE kind = 'purchase'`)[0]?.n;
      const before = await purchases();
      const payload = 'checkout.session.completed for acc_somebody';
      const at = Math.floor(Date.now() / 1000);
      const v1 = createHmac('sha256', WEBHOOK_SECRET).update(`${at}.${payload}`).digest('hex');
      const res = await fetch(hookUrl, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'stripe-signature': `t=${at},v1=${v1}` },
        body: payload,
      });
      t.equal(res.status, 400);
      t.same(await res.json(), { error: 'invalid_request', message: 'The event is not JSON.' });
      t.equal(await purchases(), before, 'no purchase was recorded');
    });

    t.test('at the monthly cap a launch and a prompt are 402 insufficient_credits, credit or not', async (t) => {
      const capped = await paymentOn(t, backend, fake, { PAYMENT_MONTHLY_CAP_CENTS: '1' });
      const me = await signUp(capped);
      const { agent } = await claudeAgent(t, capped.http, me.key);
      await ledger.grant(capped.db.sql, me.accountId, 10_000_000, 'test');
      const billingOf = async () => (await capped.http.get('/api/account/billing', { token: me.key })).body;
      t.equal((await billingOf()).cap_cents, 1, 'the cap is shown');
      const started = await capped.http.post('/api/conversations', {
        token: me.key,
        body: { agent_id: agent.id, prompt: 'hello' },
      });
      t.equal(started.status, 201, `below the cap it launches: ${started.text}`);
      const state = await until('the turn is charged', async () => {
        const b = await billingOf();
        return b.usage.credit_burned_cents >= 1 ? b : undefined;
      });
      t.ok(state.balance_cents > 0, 'credit is left');
      const capMessage = {
        error: 'insufficient_credits',
        message: "The account reached this month's spending cap.",
        upgrade_url: UPGRADE_URL,
      };
      const prompt = await capped.http.post(`/api/conversations/${started.body.id}/prompts`, {
        token: me.key,
        body: { prompt: 'again' },
      });
      t.equal(prompt.status, 402, prompt.text);
      t.same(prompt.body, capMessage);
      const launch = await capped.http.post('/api/conversations', {
        token: me.key,
        body: { agent_id: agent.id, prompt: 'another' },
      });
      t.equal(launch.status, 402, launch.text);
      t.same(launch.body, capMessage);
      t.equal((await turnsOf(capped, me.key, started.body.id)).length, 1, 'no turn was opened');
      t.equal(
        (await capped.http.get('/api/conversations', { token: me.key })).body.data.length,
        1,
        'no conversation was launched',
      );
    });

    t.test('a provider that refuses the checkout is 502', async (t) => {
      const badKey = await paymentOn(t, backend, fake, { PAYMENT_PROVIDER_KEY: 'sk_test_wrong' });
      const me = await signUp(badKey);
      const res = await badKey.http.post('/api/account/billing/credits/checkout', { token: me.key });
      t.equal(res.status, 502);
      t.equal(res.body.error, 'network');
      t.match(res.body.message, /answered 401: Invalid API Key/);
    });
  });
}

/** What holds on any backend: a payment provider out of reach, a key without its secret. */
export function paymentStartChecks(): void {
  t.test('a payment provider that cannot be reached is 502 network', async (t) => {
    const fake = await startFakeStripe({ secretKey: SECRET_KEY, webhookSecret: WEBHOOK_SECRET });
    const closedUrl = fake.url;
    await fake.close();
    const svc = await paymentOn(t, 'embedded', { ...fake, url: closedUrl });
    const me = await signUp(svc);
    const res = await svc.http.post('/api/account/billing/credits/checkout', { token: me.key });
    t.equal(res.status, 502);
    t.equal(res.body.error, 'network');
    t.match(res.body.message, /could not be reached/);
  });

  t.test('a payment key without a webhook signing secret stops the start, naming the variable', async (t) => {
    t.throws(() => loadConfig({ PAYMENT_PROVIDER_KEY: SECRET_KEY }), /PAYMENT_WEBHOOK_SECRET: required/);
  });
}
