import { ApiError } from '@svc/core';
import { accounts, oauthCodes, type Sql } from '@svc/db';
import { hashSecret, newSecret, pkceChallenge, safeEqual } from '../secrets/tokens.ts';
import { recordAudit } from './audit.ts';
import { createOAuthKey } from './credentials.ts';

/** OAUTH_CLIENTS: client id to its exact redirect URIs (public clients, PKCE S256 only). */
export type OAuthClients = Record<string, string[]>;

const CODE_TTL_MS = 5 * 60_000;
export const OAUTH_KEY_TTL_S = 30 * 86_400;

export interface AuthorizeParams {
  client_id?: string | undefined;
  redirect_uri?: string | undefined;
  code_challenge?: string | undefined;
  code_challenge_method?: string | undefined;
  state?: string | undefined;
  response_type?: string | undefined;
}

/**
 * Checks an authorization request. `fatal` problems (unknown client, unregistered redirect)
 * are shown on an error page and never redirected to; `redirectable` ones go back to the
 * client's redirect URI as `error=invalid_request` (RFC 6749 4.1.2.1).
 */
export function checkAuthorizeRequest(
  clients: OAuthClients,
  p: AuthorizeParams,
):
  | { ok: true }
  | { ok: false; fatal: true; message: string }
  | { ok: false; fatal: false; error: string; message: string } {
  const uris = p.client_id ? clients[p.client_id] : undefined;
  if (!p.client_id || !uris) return { ok: false, fatal: true, message: 'Unknown client.' };
  if (!p.redirect_uri || !uris.includes(p.redirect_uri)) {
    return { ok: false, fatal: true, message: 'The redirect URI is not registered for this client.' };
  }
  if (p.response_type !== undefined && p.response_type !== 'code') {
    return { ok: false, fatal: false, error: 'unsupported_response_type', message: 'Only response_type=code.' };
  }
  if (p.code_challenge_method !== 'S256' || !p.code_challenge || !/^[A-Za-z0-9_-]{43}$/.test(p.code_challenge)) {
    return {
      ok: false,
      fatal: false,
      error: 'invalid_request',
      message: 'PKCE with code_challenge_method=S256 is required.',
    };
  }
  return { ok: true };
}

/** Issues a single-use code (5 minutes) for the account; the plaintext goes to the redirect only. */
export async function issueCode(
  sql: Sql,
  accountId: string,
  p: Required<Pick<AuthorizeParams, 'client_id' | 'redirect_uri' | 'code_challenge'>>,
  ip: string | null,
) {
  const code = newSecret('');
  await oauthCodes.insertOAuthCode(sql, {
    codeHash: hashSecret(code),
    accountId,
    clientId: p.client_id,
    redirectUri: p.redirect_uri,
    codeChallenge: p.code_challenge,
    expiresAt: new Date(Date.now() + CODE_TTL_MS),
  });
  await recordAudit(sql, { accountId, actor: 'ui', ip }, 'oauth.authorized', { type: 'oauth_client', id: p.client_id });
  return code;
}

/**
 * Exchanges a code for a full-scope key (RFC 6749 4.1.3 with RFC 7636). The code is used up by
 * the first attempt whatever its outcome, so a stolen code cannot be retried with guesses.
 */
export async function exchangeCode(
  sql: Sql,
  clients: OAuthClients,
  input: { grant_type?: string; code?: string; code_verifier?: string; client_id?: string; redirect_uri?: string },
) {
  if (input.grant_type !== 'authorization_code') {
    throw new ApiError('unsupported_grant_type', undefined, {
      extra: { error_description: 'Only authorization_code.' },
    });
  }
  const invalid = (why: string) => new ApiError('invalid_grant', why, { extra: { error_description: why } });
  if (!input.code || !input.code_verifier || !input.client_id || !input.redirect_uri) {
    throw invalid('code, code_verifier, client_id and redirect_uri are required.');
  }
  if (!clients[input.client_id]) throw invalid('Unknown client.');
  const row = await oauthCodes.consumeOAuthCode(sql, hashSecret(input.code));
  if (!row) throw invalid('The code is unknown, used or expired.');
  if (row.client_id !== input.client_id || row.redirect_uri !== input.redirect_uri) {
    throw invalid('The code was issued to another client or redirect URI.');
  }
  if (
    !/^[A-Za-z0-9._~-]{43,128}$/.test(input.code_verifier) ||
    !safeEqual(pkceChallenge(input.code_verifier), row.code_challenge)
  ) {
    throw invalid('The code_verifier does not match the code_challenge.');
  }
  const account = await accounts.findAccountById(sql, row.account_id);
  if (!account || account.suspended) throw invalid('The account is not available.');
  const { key, row: keyRow } = await createOAuthKey(sql, account.id, input.client_id, account.session_version);
  await recordAudit(
    sql,
    { accountId: account.id, actor: 'system', ip: null },
    'oauth.token_issued',
    {
      type: 'api_key',
      id: keyRow.id,
    },
    { client_id: input.client_id },
  );
  return { access_token: key, token_type: 'bearer' as const, expires_in: OAUTH_KEY_TTL_S };
}
