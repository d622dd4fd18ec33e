import { z } from 'zod';

/** `GET /api/account/billing` (SPEC "Billing usage"). */
export const BillingState = z
  .object({
    balance_cents: z.int().meta({
      description:
        'Credit left, in cents: the sum of the credit ledger (grants and purchases, less turn charges). Launches and prompts answer 402 `insufficient_credits` at zero or below.',
    }),
    cap_cents: z.int().nullable().meta({
      description:
        'The monthly spending cap in cents (PAYMENT_MONTHLY_CAP_CENTS): once `usage.credit_burned_cents` reaches it, launches and prompts answer 402 until the month ends. Null when the instance sets none.',
    }),
    comped: z
      .boolean()
      .meta({ description: 'An operator-made free account: never charged, never refused for credit.' }),
    usage: z
      .object({
        month: z.string().meta({ description: 'The calendar month (UTC) the figures cover, `YYYY-MM`.' }),
        conversations: z.int().meta({ description: 'Conversations that ran a turn in the month.' }),
        credit_burned_cents: z.int().meta({
          description:
            'Credit turn charges took in the month. A turn is charged when it ends, so a turn running now is not in it yet.',
        }),
        turn_hours: z
          .number()
          .meta({ description: 'Metered time (turn start to end) of turns that ended in the month.' }),
      })
      .meta({ id: 'BillingUsage' }),
  })
  .meta({ id: 'Billing' });

export const CheckoutSession = z
  .object({
    url: z.url().meta({ description: "The payment provider's one-time checkout page for one credit pack." }),
  })
  .meta({ id: 'CheckoutSession' });
