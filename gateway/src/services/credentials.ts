import { ApiError, newId, orNotFound } from '@svc/core';
import { credentials, type Sql, sessions } from '@svc/db';
import { hashSecret, hashSecretText, newSecret } from '../secrets/tokens.ts';
import { recordAudit } from './audit.ts';
import type { CachedCredential, CredentialCache } from './credential-cache.ts';
import { type ActorRef, actorOf, type Principal } from './principal.ts';

/** Prefixes make a leaked secret recognisable to scanners and people. */
export const SECRET_PREFIX = { api: 'svc_', oauth: 'svco_', sandbox: 'svcs_', session: 'svcsess_' } as const;

const SESSION_DAYS = 30;

/** What authenticating and revoking need: the database and the node's credential cache. */
export interface AuthDeps {
  sql: Sql;
  credentialCache: CredentialCache;
}

/** `last_used_at` moves at most once a minute, so a busy key writes at most once a minute. */
const TOUCH_EVERY_MS = 60_000;

function shape(row: credentials.CredentialRow) {
  return {
    id: row.id,
    name: row.name,
    prefix: row.prefix,
    scope: row.scope as 'full' | 'standard',
    created_at: row.created_at.toISOString(),
    expires_at: row.expires_at?.toISOString() ?? null,
    last_used_at: row.last_used_at?.toISOString() ?? null,
  };
}

/** Mints an API key; the plaintext is in the answer and nowhere else. */
export async function createApiKey(
  sql: Sql,
  who: ActorRef,
  input: { name?: string | undefined; scope: 'full' | 'standard'; expiresInDays?: number | null | undefined },
) {
  const key = newSecret(SECRET_PREFIX.api);
  const expiresAt = input.expiresInDays ? new Date(Date.now() + input.expiresInDays * 86_400_000) : null;
  const row = await credentials.insertCredential(sql, {
    id: newId('key'),
    accountId: who.accountId,
    kind: 'api',
    name: input.name ?? 'API key',
    prefix: key.slice(0, 12),
    tokenHash: hashSecret(key),
    scope: input.scope,
    expiresAt,
  });
  await recordAudit(sql, who, 'api_key.created', { type: 'api_key', id: row.id }, { scope: row.scope, name: row.name });
  return { ...shape(row), key };
}

/** Mints the full-scope key an OAuth client receives: 30 days, listed as `oauth:<client_id>`,
 * signed out with every session by a password reset or email change. */
export async function createOAuthKey(sql: Sql, accountId: string, clientId: string, sessionVersion: number) {
  const key = newSecret(SECRET_PREFIX.oauth);
  const row = await credentials.insertCredential(sql, {
    id: newId('key'),
    accountId,
    kind: 'oauth',
    name: `oauth:${clientId}`,
    prefix: key.slice(0, 12),
    tokenHash: hashSecret(key),
    scope: 'full',
    clientId,
    sessionVersion,
    expiresAt: new Date(Date.now() + 30 * 86_400_000),
  });
  return { key, row };
}

/**
 * Mints the token a conversation's sandbox holds (actor `sprite`): it reaches only routes
 * that opt in to sandbox tokens, and only for its own conversation.
 */
export async function issueSandboxToken(sql: Sql, accountId: string, conversationId: string) {
  const key = newSecret(SECRET_PREFIX.sandbox);
  const row = await credentials.insertCredential(sql, {
    id: newId('spt'),
    accountId,
    kind: 'sandbox',
    name: `sandbox:${conversationId}`,
    prefix: key.slice(0, 12),
    tokenHash: hashSecret(key),
    scope: 'conversation',
    conversationId,
  });
  return { key, id: row.id };
}

export async function listApiKeys(sql: Sql, accountId: string) {
  return (await credentials.listKeys(sql, accountId)).map(shape);
}

export async function revokeApiKey(deps: AuthDeps, p: Principal, id: string): Promise<void> {
  // A standard key cannot undo a full-scope one (DECISIONS: scopes).
  const outcome = await credentials.revokeKey(deps.sql, p.accountId, id, { allowFull: p.scope === 'full' });
  if (outcome === 'forbidden') throw new ApiError('forbidden', 'Revoking a full-scope key needs a full-scope key.');
  orNotFound(outcome === 'revoked', 'API key');
  await deps.credentialCache.forgetAccount(p.accountId);
  await recordAudit(deps.sql, actorOf(p), 'api_key.revoked', { type: 'api_key', id });
}

function principalOf(c: CachedCredential, ip: string | null): Principal {
  if (c.suspended) throw new ApiError('account_suspended');
  return {
    accountId: c.accountId,
    actor: c.actor,
    scope: c.scope,
    role: c.role,
    credentialId: c.credentialId,
    conversationId: null,
    ip,
  };
}

/**
 * What a secret of one kind names, from the node's credential cache or else from `load`
 * (which reads Postgres). The kind is part of the cache key, so a secret remembered as an API
 * key is never found as a session cookie, nor a session as a bearer key. `load` may answer a
 * principal instead of a cacheable credential (a sandbox token): it is passed on, not kept.
 */
async function throughCache(
  deps: AuthDeps,
  kind: 'bearer' | 'session',
  secret: string,
  load: (hash: Buffer) => Promise<CachedCredential | Principal | undefined>,
): Promise<CachedCredential | Principal | undefined> {
  if (secret.length > 200) return undefined;
  const digest = hashSecretText(secret);
  const key = `${kind}:${digest}`;
  const hit = deps.credentialCache.get(key);
  if (hit) return hit;
  const ticket = deps.credentialCache.begin();
  // The bytes again, for the lookup in Postgres (a miss).
  const found = await load(Buffer.from(digest, 'base64'));
  if (found && isCacheable(found)) deps.credentialCache.put(key, found, ticket);
  return found;
}

function isCacheable(found: CachedCredential | Principal): found is CachedCredential {
  return 'suspended' in found;
}

/** Stamps `last_used_at` when it would move (the SQL keeps the same rule across nodes). */
function touchIfDue(sql: Sql, credentialId: string, lastUsedAt: number | null): boolean {
  if (lastUsedAt !== null && Date.now() - lastUsedAt < TOUCH_EVERY_MS) return false;
  void credentials.touchCredential(sql, credentialId).catch(() => {});
  return true;
}

/**
 * Resolves `Authorization: Bearer <secret>` to a principal, or undefined when it is not live.
 * API and OAuth keys are served from the node's credential cache when it holds them; a key's
 * `last_used_at` is written only when it would move (at most once a minute).
 */
export async function authenticateBearer(
  deps: AuthDeps,
  secret: string,
  ip: string | null,
): Promise<Principal | undefined> {
  const found = await throughCache(deps, 'bearer', secret, async (hash) => {
    const row = await credentials.findLiveCredential(deps.sql, hash);
    if (!row) return undefined;
    if (row.kind === 'sandbox') return sandboxPrincipal(deps.sql, row, ip);
    return {
      accountId: row.account_id,
      actor: 'api',
      scope: row.scope as CachedCredential['scope'],
      role: row.account_role,
      credentialId: row.id,
      suspended: row.account_suspended,
      expiresAt: row.expires_at?.getTime() ?? null,
      lastUsedAt: row.last_used_at?.getTime() ?? null,
    };
  });
  if (!found || !isCacheable(found)) return found;
  const principal = principalOf(found, ip);
  if (touchIfDue(deps.sql, found.credentialId, found.lastUsedAt)) found.lastUsedAt = Date.now();
  return principal;
}

/** A sandbox token (actor `sprite`): read from Postgres each time, never cached. */
function sandboxPrincipal(sql: Sql, row: credentials.CredentialWithAccount, ip: string | null): Principal {
  if (row.account_suspended) throw new ApiError('account_suspended');
  touchIfDue(sql, row.id, row.last_used_at?.getTime() ?? null);
  return {
    accountId: row.account_id,
    actor: 'sprite',
    scope: row.scope,
    role: row.account_role,
    credentialId: row.id,
    conversationId: row.conversation_id,
    ip,
  };
}

/** Opens a browser session; returns the cookie value (shown to the browser only). */
export async function createSession(sql: Sql, accountId: string, sessionVersion: number) {
  const secret = newSecret(SECRET_PREFIX.session);
  const expiresAt = new Date(Date.now() + SESSION_DAYS * 86_400_000);
  await sessions.insertSession(sql, {
    id: newId('ses'),
    accountId,
    tokenHash: hashSecret(secret),
    sessionVersion,
    expiresAt,
  });
  return { secret, expiresAt };
}

/** Resolves a browser session's cookie to a principal (actor `ui`), through the credential cache. */
export async function authenticateSession(
  deps: AuthDeps,
  secret: string,
  ip: string | null,
): Promise<Principal | undefined> {
  const found = await throughCache(deps, 'session', secret, async (hash) => {
    const row = await sessions.findLiveSession(deps.sql, hash);
    if (!row) return undefined;
    return {
      accountId: row.account_id,
      actor: 'ui',
      scope: 'full',
      role: row.account_role,
      credentialId: row.id,
      suspended: row.account_suspended,
      expiresAt: row.expires_at.getTime(),
      lastUsedAt: null,
    };
  });
  return found && isCacheable(found) ? principalOf(found, ip) : found;
}

export async function endSession(deps: AuthDeps, secret: string, ip: string | null): Promise<void> {
  const ended = await sessions.deleteSession(deps.sql, hashSecret(secret));
  if (ended) {
    await deps.credentialCache.forgetAccount(ended.account_id);
    await recordAudit(deps.sql, { accountId: ended.account_id, actor: 'ui', ip }, 'session.ended', {
      type: 'session',
      id: ended.id,
    });
  }
}

/** RFC 7009 revoke of the presented key (API or OAuth); sandbox tokens end with their conversation. */
export async function revokePresentedKey(deps: AuthDeps, secret: string, ip: string | null): Promise<void> {
  if (secret.startsWith(SECRET_PREFIX.sandbox)) {
    throw new ApiError('forbidden', 'A sandbox token cannot be revoked here.');
  }
  const row = await credentials.revokeCredentialByHash(deps.sql, hashSecret(secret));
  if (row) {
    await deps.credentialCache.forgetAccount(row.account_id);
    await recordAudit(
      deps.sql,
      { accountId: row.account_id, actor: 'api', ip },
      'api_key.revoked',
      { type: 'api_key', id: row.id },
      {
        via: 'oauth_revoke',
      },
    );
  }
}
