import { ApiError } from '@svc/core';
import type { Logger } from 'pino';
import { exemptMatcher } from '../addresses.ts';
import type { AdmissionMetrics } from '../metrics.ts';
import type { RateLimiter } from './ratelimit.ts';

/** What admitting a request decides: nothing (admitted) or the error to answer, maybe later. */
export type Admission = ApiError | undefined | Promise<ApiError | undefined>;

/** Decides, for a client IP and a path, whether a request may proceed; called once per request. */
export type AdmitFor = (ip: string, path: string) => () => Admission;

/**
 * The rate limit in front of every path of `/api`, per client IP, whichever server listens
 * (the edge, or Fastify alone): a token bucket (RATE_LIMIT_PER_MINUTE), networks in
 * RATE_LIMIT_EXEMPT passing freely. Streams count once, at open. A limiter that fails lets the
 * request through: an outage of the limit must not take the API down with it. Each refusal is
 * counted in `metrics`.
 */
export function admission(
  limiter: RateLimiter | undefined,
  exemptCidrs: readonly string[],
  log: Logger,
  metrics?: AdmissionMetrics,
): AdmitFor {
  const exempt = exemptMatcher(exemptCidrs);
  return (ip, path) => (): Admission => {
    if (!limiter || !path.startsWith('/api') || exempt(ip)) return undefined;
    const refuse = (d: { allowed: boolean; retryAfterS: number }) => {
      if (d.allowed) return undefined;
      metrics?.rateLimited();
      return new ApiError('rate_limited', undefined, { retryAfter: d.retryAfterS });
    };
    try {
      const decision = limiter.take(ip);
      if (!(decision instanceof Promise)) return refuse(decision);
      return decision.then(refuse, (err: Error) => {
        log.warn({ err: { message: err.message } }, 'rate limiter unavailable; request admitted');
        return undefined;
      });
    } catch (err) {
      log.warn({ err: { message: (err as Error).message } }, 'rate limiter failed; request admitted');
      return undefined;
    }
  };
}
