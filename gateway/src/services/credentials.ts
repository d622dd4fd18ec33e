import { ApiError, newId, orNotFound } from '@svc/core';
import { credentials, type Sql, sessions } from '@svc/db';
import { hashSecret, newSecret } from '../secrets/tokens.ts';
import { recordAudit } from './audit.ts';
import { type ActorRef, actorOf, type Principal } from './principal.ts';

/** Prefixes make a leaked secret recognisable to scanners and people. */
export const SECRET_PREFIX = { api: 'svc_', oauth: 'svco_', sandbox: 'svcs_', session: 'svcsess_' } as const;

const SESSION_DAYS = 30;

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

export async function revokeApiKey(sql: Sql, p: Principal, id: string): Promise<void> {
  orNotFound(await credentials.revokeKey(sql, p.accountId, id), 'API key');
  await recordAudit(sql, actorOf(p), 'api_key.revoked', { type: 'api_key', id });
}

/** Resolves `Authorization: Bearer <secret>` to a principal, or undefined when it is not live. */
export async function authenticateBearer(sql: Sql, secret: string, ip: string | null): Promise<Principal | undefined> {
  if (secret.length > 200) return undefined;
  const row = await credentials.findLiveCredential(sql, hashSecret(secret));
  if (!row) return undefined;
  if (row.account_suspended) throw new ApiError('account_suspended');
  void credentials.touchCredential(sql, row.id).catch(() => {});
  return {
    accountId: row.account_id,
    actor: row.kind === 'sandbox' ? 'sprite' : 'api',
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

export async function authenticateSession(sql: Sql, secret: string, ip: string | null): Promise<Principal | undefined> {
  if (secret.length > 200) return undefined;
  const row = await sessions.findLiveSession(sql, hashSecret(secret));
  if (!row) return undefined;
  if (row.account_suspended) throw new ApiError('account_suspended');
  return {
    accountId: row.account_id,
    actor: 'ui',
    scope: 'full',
    role: row.account_role,
    credentialId: row.id,
    conversationId: null,
    ip,
  };
}

export async function endSession(sql: Sql, secret: string, ip: string | null): Promise<void> {
  const ended = await sessions.deleteSession(sql, hashSecret(secret));
  if (ended) {
    await recordAudit(sql, { accountId: ended.account_id, actor: 'ui', ip }, 'session.ended', {
      type: 'session',
      id: ended.id,
    });
  }
}

/** RFC 7009 revoke of the presented key (API or OAuth); sandbox tokens end with their conversation. */
export async function revokePresentedKey(sql: Sql, secret: string, ip: string | null): Promise<void> {
  if (secret.startsWith(SECRET_PREFIX.sandbox)) {
    throw new ApiError('forbidden', 'A sandbox token cannot be revoked here.');
  }
  const row = await credentials.revokeCredentialByHash(sql, hashSecret(secret));
  if (row) {
    await recordAudit(
      sql,
      { accountId: row.account_id, actor: 'api', ip },
      'api_key.revoked',
      { type: 'api_key', id: row.id },
      {
        via: 'oauth_revoke',
      },
    );
  }
}
