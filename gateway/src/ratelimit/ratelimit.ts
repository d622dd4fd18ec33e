/**
 * The rate limiter port: a token bucket per key (the client IP). Each bucket holds up to
 * `burst` tokens and refills at `perMinute` tokens a minute. `take` removes one token.
 *
 * Guarantees: `allowed` is false exactly when the bucket is empty; `retryAfterS` is then the
 * whole number of seconds (at least 1) until a token is back. A bucket untouched for long
 * enough to refill completely is forgotten. Adapters shared across nodes (Redis) make one
 * bucket per key for the whole fleet.
 */
export interface RateLimiter {
  take(key: string): Promise<RateDecision> | RateDecision;
  close?(): Promise<void>;
}

export interface RateDecision {
  allowed: boolean;
  retryAfterS: number;
}

export interface RateLimitOptions {
  perMinute: number;
  burst: number;
}

/** Seconds until one token is back, given the current (fractional) token count. */
export function retryAfterSeconds(tokens: number, perMinute: number): number {
  const missing = 1 - tokens;
  return Math.max(1, Math.ceil((missing * 60) / perMinute));
}
