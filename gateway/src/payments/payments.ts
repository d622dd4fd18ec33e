/** One credit pack to sell: the credit it adds and its price, in cents of `currency`. */
export interface CreditPack {
  creditCents: number;
  priceCents: number;
  currency: string;
}

/** A confirmed payment the provider's webhook reported: credit `creditCents` to `accountId`. */
export interface PaidCheckout {
  /** The provider's event id: the same payment reported twice carries the same id. */
  eventId: string;
  accountId: string;
  creditCents: number;
  /** The provider's own reference (its checkout session id), for the ledger's note. */
  reference: string;
}

/**
 * The payment-provider port. `checkout` creates a one-time checkout page for one pack and
 * resolves to its address; it rejects with a `PaymentProviderError` when the provider refused
 * or could not be reached (nothing was sold then). `paidCheckout` reads an inbound webhook:
 * it verifies the signature over the exact bytes received and throws `BadSignature` when it
 * does not hold; it resolves to the paid checkout the event confirms, or null for any other
 * event (one the service does not act on).
 */
export interface Payments {
  checkout(input: {
    accountId: string;
    pack: CreditPack;
    successUrl: string;
    cancelUrl: string;
  }): Promise<{ url: string }>;
  paidCheckout(payload: string, signatureHeader: string | undefined, now: Date): PaidCheckout | null;
}

export class PaymentProviderError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PaymentProviderError';
  }
}

export class BadSignature extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BadSignature';
  }
}
