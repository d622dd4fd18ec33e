import { type AdminAction, ApiError } from '@svc/core';
import { accounts, admin, billing as ledger, type Sql } from '@svc/db';
import { BadSignature, type CreditPack, PaymentProviderError, type Payments } from '../payments/payments.ts';
import { getUser } from './admin-users.ts';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';

/*
 * Billing and credits. Payment is on when the instance has a payment provider key: the
 * composition root then builds a `Billing`; with payment off it passes null, nothing is
 * charged or gated, and the billing routes answer 404 with `billing: disabled`.
 */

export interface Billing {
  payments: Payments;
  pack: CreditPack;
  /** What an hour of turn time costs, in cents. */
  centsPerTurnHour: number;
  /** Credit a calendar month may burn, in cents; null for no cap. */
  monthlyCapCents: number | null;
  /** Where a 402 sends people to buy credit. */
  upgradeUrl: () => string;
  /** The service's public base URL: checkout return pages are built on it, never taken from callers. */
  publicUrl: () => string;
}

/** The 404 every billing route answers while payment is off. */
export function billingDisabled(): ApiError {
  return new ApiError('not_found', 'Billing is not enabled on this instance.', { extra: { billing: 'disabled' } });
}

function enabled(billing: Billing | null): Billing {
  if (!billing) throw billingDisabled();
  return billing;
}

/** `GET /api/account/billing`: balance, cap and the current month's usage (UTC). */
export async function billingState(sql: Sql, billing: Billing | null, accountId: string, now = new Date()) {
  const policy = enabled(billing);
  const account = await accounts.findAccountById(sql, accountId);
  const [balance, usage] = await Promise.all([ledger.balance(sql, accountId), ledger.monthUsage(sql, accountId, now)]);
  return {
    balance_cents: balance,
    cap_cents: policy.monthlyCapCents,
    comped: account?.comped ?? false,
    usage: {
      month: now.toISOString().slice(0, 7),
      conversations: usage.conversations,
      credit_burned_cents: usage.creditBurnedCents,
      turn_hours: usage.turnMs / 3_600_000,
    },
  };
}

/**
 * The credit gate of a launch and a prompt (and so of team messages and scheduled runs, which
 * go through them): with payment on, an account that is not comped is refused 402
 * `insufficient_credits` (with `upgrade_url`) when its balance is zero or below, or when the
 * month's charges reached the cap. Nothing is gated while payment is off.
 */
export async function requireCredit(sql: Sql, billing: Billing | null, accountId: string): Promise<void> {
  if (!billing) return;
  const account = await accounts.findAccountById(sql, accountId);
  if (!account || account.comped) return;
  const upgrade = { extra: { upgrade_url: billing.upgradeUrl() } };
  if ((await ledger.balance(sql, accountId)) <= 0) {
    throw new ApiError('insufficient_credits', 'The account has no credit left; buy a credit pack.', upgrade);
  }
  if (billing.monthlyCapCents !== null) {
    const { creditBurnedCents } = await ledger.monthUsage(sql, accountId, new Date());
    if (creditBurnedCents >= billing.monthlyCapCents) {
      throw new ApiError('insufficient_credits', "The account reached this month's spending cap.", upgrade);
    }
  }
}

/**
 * Charges a turn that ended its metered time (start to end), once per turn however often it
 * is called, never for a comped account, nothing while payment is off. Called at every turn
 * end the runner reports (user and autonomous turns alike) and where the service ends a turn
 * itself on a request (interrupt with the runner away, terminate).
 */
export async function chargeEndedTurn(
  sql: Sql,
  billing: Billing | null | undefined,
  accountId: string,
  turnId: string,
): Promise<void> {
  if (!billing) return;
  await ledger.chargeTurn(sql, accountId, turnId, billing.centsPerTurnHour);
}

/**
 * `POST /api/account/billing/credits/checkout`: a one-time checkout page for one credit pack
 * at the payment provider, returning to pages the server picks. 422 `account_comped` for a
 * comped account (it needs no credit); 502 `network` when the provider refused or could not
 * be reached.
 */
export async function startCheckout(sql: Sql, billing: Billing | null, who: ActorRef): Promise<{ url: string }> {
  const policy = enabled(billing);
  const account = await accounts.findAccountById(sql, who.accountId);
  if (account?.comped) throw new ApiError('account_comped');
  const back = `${policy.publicUrl()}/api/account/billing`;
  try {
    const session = await policy.payments.checkout({
      accountId: who.accountId,
      pack: policy.pack,
      successUrl: `${back}?checkout=success`,
      cancelUrl: `${back}?checkout=cancelled`,
    });
    await recordAudit(sql, who, 'billing.checkout.created', { type: 'account', id: who.accountId });
    return session;
  } catch (err) {
    if (err instanceof PaymentProviderError) throw new ApiError('network', err.message);
    throw err;
  }
}

/**
 * The payment provider's inbound webhook: verified over the exact bytes received (401
 * `unauthorized` when the signature does not hold), then a paid checkout credits its pack
 * once per provider event, however often the provider delivers it. Other events are
 * acknowledged and ignored. Resolves to whether the balance moved now.
 */
export async function receivePaymentEvent(
  sql: Sql,
  billing: Billing | null,
  payload: string,
  signature: string | undefined,
): Promise<boolean> {
  const policy = enabled(billing);
  let paid: ReturnType<Payments['paidCheckout']>;
  try {
    paid = policy.payments.paidCheckout(payload, signature, new Date());
  } catch (err) {
    if (err instanceof BadSignature) throw new ApiError('unauthorized', err.message);
    if (err instanceof SyntaxError) throw new ApiError('invalid_request', 'The event is not JSON.');
    throw err;
  }
  if (!paid) return false;
  const credited = await ledger.recordPurchase(sql, {
    accountId: paid.accountId,
    cents: paid.creditCents,
    eventId: paid.eventId,
    note: `checkout ${paid.reference}`,
  });
  if (credited) {
    await recordAudit(
      sql,
      { accountId: paid.accountId, actor: 'system', ip: null },
      'billing.credits.purchased',
      { type: 'account', id: paid.accountId },
      { cents: paid.creditCents, event_id: paid.eventId },
    );
  }
  return credited;
}

/**
 * `POST /api/admin/users/:id/comp`: an operator makes the account free (never charged, never
 * refused for credit) or paying again. 404 when no account has the id. Written to the
 * privilege trail; answers the admin user row.
 */
export async function compAccount(sql: Sql, billing: Billing | null, who: ActorRef, userId: string, comped: boolean) {
  enabled(billing);
  const before = await getUser(sql, userId);
  await ledger.setComped(sql, userId, comped);
  await trail(sql, who, 'admin.user.comp', userId, { from: before.comped, to: comped });
  return getUser(sql, userId);
}

/**
 * `POST /api/admin/users/:id/credits`: an operator grants credit (a `grant` row on the
 * ledger; negative cents take credit back). 404 when no account has the id. Written to the
 * privilege trail (cents, never the note); answers the account's balance after it.
 */
export async function grantCredit(
  sql: Sql,
  billing: Billing | null,
  who: ActorRef,
  userId: string,
  input: { cents: number; note: string },
) {
  enabled(billing);
  await getUser(sql, userId);
  if (!(await ledger.grant(sql, userId, input.cents, input.note)))
    throw new ApiError('not_found', 'No account has that id.');
  await trail(sql, who, 'admin.user.credits', userId, { cents: input.cents });
  return { id: userId, balance_cents: await ledger.balance(sql, userId) };
}

function trail(sql: Sql, who: ActorRef, action: AdminAction, userId: string, metadata: Record<string, unknown>) {
  return admin.insertAdminEvent(sql, {
    adminId: who.accountId,
    action,
    targetType: 'account',
    targetId: userId,
    metadata,
    requestIp: who.ip,
  });
}
