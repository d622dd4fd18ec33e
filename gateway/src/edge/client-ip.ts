import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import { addressText, clientAddress, exemptMatcher } from '../addresses.ts';

/** The client's address of a uWS request; call before the handler returns (uWS frees `req`). */
export type ClientOf = (res: HttpResponse, req: HttpRequest) => string;

/** The edge's reading of the client's address, trusting the proxies in `trustProxy` (CIDRs). */
export function edgeClientOf(trustProxy: readonly string[]): ClientOf {
  const trusted = trustProxy.length ? exemptMatcher(trustProxy) : undefined;
  return (res, req) => {
    const peer = addressText(new Uint8Array(res.getRemoteAddress()));
    if (!trusted) return peer;
    // Every header of the name: a proxy may add its own line rather than extend the client's.
    let forwardedFor: string | undefined;
    req.forEach((name, value) => {
      if (name === 'x-forwarded-for') forwardedFor = forwardedFor === undefined ? value : `${forwardedFor},${value}`;
    });
    return clientAddress(peer, forwardedFor, trusted);
  };
}
