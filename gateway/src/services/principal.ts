import type { Actor } from '@svc/core';

/**
 * Who is calling, as every service sees it. `actor` is how the request authenticated (SPEC
 * Audit: `ui` browser session, `api` bearer key, `sprite` sandbox token); `scope` what the
 * credential may reach; `ip` the client address the edge saw, for audit rows.
 */
export interface Principal {
  accountId: string;
  actor: Exclude<Actor, 'system'>;
  scope: 'full' | 'standard' | 'conversation';
  role: 'user' | 'admin';
  credentialId: string;
  /** Set for sandbox tokens: the one conversation the token may act on. */
  conversationId: string | null;
  ip: string | null;
}

/** Who acted, for an audit row: a principal, or the service itself on behalf of an account. */
export interface ActorRef {
  accountId: string;
  actor: Actor;
  ip: string | null;
}

export function actorOf(p: Principal): ActorRef {
  return { accountId: p.accountId, actor: p.actor, ip: p.ip };
}
