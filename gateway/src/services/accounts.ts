import { ApiError, newId, RUNNER_CLOSE, validationFailed } from '@svc/core';
import { accounts, authTokens, type Sql, sessions } from '@svc/db';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { EventLog } from '../log/log.ts';
import type { Mailer } from '../mail/mail.ts';
import type { Keyring } from '../secrets/keyring.ts';
import { decoyPasswordHash, hashPassword, hashSecret, newSecret, verifyPassword } from '../secrets/tokens.ts';
import { recordAudit } from './audit.ts';
import type { CredentialCache } from './credential-cache.ts';
import { createApiKey, createSession } from './credentials.ts';
import type { ExportFiles } from './exports.ts';
import { type ActorRef, actorOf, type Principal } from './principal.ts';
import { destroyAccountSandboxes, type SandboxDeps } from './sandboxes.ts';

export interface AccountDeps {
  sql: Sql;
  mailer: Mailer;
  keyring: Keyring;
  log: Logger;
  publicUrl: () => string;
  adminEmails: readonly string[];
  /** Where the account's export files are kept; erasing the account removes them. */
  exportFiles: Pick<ExportFiles, 'removeAccount'>;
  /** Told after every change that ends a key or session, here and on every node. */
  credentialCache: Pick<CredentialCache, 'forgetAccount'>;
}

const HOUR = 3_600_000;
const TOKEN_TTL = { verify: 48 * HOUR, reset: HOUR, email_change: 24 * HOUR } as const;

const NEUTRAL = {
  register: {
    status: 'verification_sent',
    message: 'If the address can be registered, a verification link is on its way.',
  },
  resend: {
    status: 'verification_sent',
    message: 'If the address has an unverified account, a new link is on its way.',
  },
  forgot: { status: 'reset_sent', message: 'If the address has an account, a reset link is on its way.' },
  email: { status: 'confirmation_sent', message: 'If the address is free, a confirmation link is on its way to it.' },
} as const;

/** Sends mail without making the caller wait or learn anything from a failure. */
function sendQuietly(deps: AccountDeps, to: string, subject: string, lines: string[]): void {
  const text = lines.join('\n\n');
  const html = lines.map((l) => `<p>${l.replace(/&/g, '&amp;').replace(/</g, '&lt;')}</p>`).join('\n');
  deps.mailer.send({ to, subject, text, html }).catch((err: Error) => {
    deps.log.error({ err: { message: err.message } }, 'mail could not be sent');
  });
}

async function mailToken(
  deps: AccountDeps,
  account: { id: string },
  purpose: authTokens.TokenPurpose,
  to: string,
  newEmail?: string,
): Promise<void> {
  await authTokens.retireAuthTokens(deps.sql, account.id, purpose);
  const token = newSecret('');
  await authTokens.insertAuthToken(deps.sql, {
    id: newId('tok'),
    accountId: account.id,
    purpose,
    tokenHash: hashSecret(token),
    expiresAt: new Date(Date.now() + TOKEN_TTL[purpose]),
    ...(newEmail ? { newEmail } : {}),
  });
  const base = deps.publicUrl();
  const route = { verify: 'verify', reset: 'reset', email_change: 'email/confirm' }[purpose];
  const page = { verify: 'verify-email', reset: 'reset-password', email_change: 'confirm-email' }[purpose];
  const subject = {
    verify: 'Verify your email address',
    reset: 'Reset your password',
    email_change: 'Confirm your new email address',
  }[purpose];
  const hours = TOKEN_TTL[purpose] / HOUR;
  sendQuietly(deps, to, subject, [
    `${subject}: open ${base}/${page}?token=${token}`,
    `Or from a terminal: curl -X POST ${base}/api/auth/${route} -H 'content-type: application/json' -d '{"token":"${token}"${purpose === 'reset' ? ',"password":"<new password>"' : ''}}'`,
    `The link works once and expires in ${hours} hour${hours === 1 ? '' : 's'}. If you did not ask for it, ignore this message.`,
  ]);
}

/**
 * Registers an account and mails a verification link. Answers the same whether or not the
 * address is taken; the owner of a taken address is told by mail instead.
 */
export async function register(deps: AccountDeps, input: { email: string; password: string }, ip: string | null) {
  const id = newId('acc');
  const role = deps.adminEmails.includes(input.email) ? 'admin' : 'user';
  const created = await accounts.insertAccount(deps.sql, {
    id,
    email: input.email,
    passwordHash: await hashPassword(input.password),
    role,
    dataKey: deps.keyring.newWrappedDataKey(id),
  });
  if (!created) {
    sendQuietly(deps, input.email, 'Someone tried to register with your address', [
      `Someone asked to register a new account with this address at ${deps.publicUrl()}, but you already have one.`,
      'If it was you, sign in or reset your password instead. Otherwise, ignore this message.',
    ]);
    return NEUTRAL.register;
  }
  await recordAudit(
    deps.sql,
    { accountId: id, actor: 'system', ip },
    'account.registered',
    { type: 'account', id },
    { role },
  );
  await mailToken(deps, created, 'verify', created.email);
  return NEUTRAL.register;
}

export async function resendVerification(deps: AccountDeps, email: string) {
  const account = await accounts.findAccountByEmail(deps.sql, email);
  if (account && !account.email_verified_at) await mailToken(deps, account, 'verify', account.email);
  return NEUTRAL.resend;
}

/** Looks up a token of a purpose: unknown or used is `invalid_token`, past its time `expired`. */
async function liveToken(sql: Sql, purpose: authTokens.TokenPurpose, token: string) {
  const row = await authTokens.findAuthToken(sql, purpose, hashSecret(token));
  if (!row) throw new ApiError('invalid_token');
  return row;
}

async function useToken(sql: Sql, row: authTokens.AuthTokenRow): Promise<void> {
  if (row.used_at) throw new ApiError('invalid_token', 'The token was already used.');
  if (row.expired) throw new ApiError('expired');
  if (!(await authTokens.useAuthToken(sql, row.id))) throw new ApiError('invalid_token', 'The token was already used.');
}

/** Activates the account. Idempotent: a used link of an already verified account answers 200. */
export async function verifyEmail(deps: AccountDeps, token: string, ip: string | null) {
  const row = await liveToken(deps.sql, 'verify', token);
  const account = await accounts.findAccountById(deps.sql, row.account_id);
  if (!account) throw new ApiError('invalid_token');
  if (account.email_verified_at) return { verified: true as const, email: account.email };
  await useToken(deps.sql, row);
  await accounts.markEmailVerified(deps.sql, account.id);
  await recordAudit(deps.sql, { accountId: account.id, actor: 'system', ip }, 'account.verified', {
    type: 'account',
    id: account.id,
  });
  return { verified: true as const, email: account.email };
}

/**
 * Checks an email and password. Unknown address and wrong password are the same 401, and
 * take the same time (a decoy hash is checked for unknown addresses).
 */
export async function checkPassword(sql: Sql, email: string, password: string) {
  const account = await accounts.findAccountByEmail(sql, email);
  const ok = await verifyPassword(password, account?.password_hash ?? (await decoyPasswordHash()));
  if (!account || !ok) throw new ApiError('unauthorized', 'Email or password is wrong.');
  if (account.suspended) throw new ApiError('account_suspended');
  if (!account.email_verified_at) throw new ApiError('email_not_verified');
  return account;
}

/** `POST /api/auth/token`: exchanges email and password for a fresh full-scope API key. */
export async function exchangePasswordForKey(deps: AccountDeps, email: string, password: string, ip: string | null) {
  const account = await checkPassword(deps.sql, email, password);
  return createApiKey(
    deps.sql,
    { accountId: account.id, actor: 'api', ip },
    { name: 'password exchange', scope: 'full' },
  );
}

export async function login(deps: AccountDeps, email: string, password: string, ip: string | null) {
  const account = await checkPassword(deps.sql, email, password);
  const session = await createSession(deps.sql, account.id, account.session_version);
  await recordAudit(deps.sql, { accountId: account.id, actor: 'ui', ip }, 'session.created', {
    type: 'account',
    id: account.id,
  });
  return session;
}

export async function forgotPassword(deps: AccountDeps, email: string, ip: string | null) {
  const account = await accounts.findAccountByEmail(deps.sql, email);
  if (account && !account.suspended) {
    await mailToken(deps, account, 'reset', account.email);
    await recordAudit(deps.sql, { accountId: account.id, actor: 'system', ip }, 'account.password_reset_requested', {
      type: 'account',
      id: account.id,
    });
  }
  return NEUTRAL.forgot;
}

/** Sets a new password from an emailed token; signs out every session (session_version + 1). */
export async function resetPassword(deps: AccountDeps, token: string, password: string, ip: string | null) {
  const row = await liveToken(deps.sql, 'reset', token);
  await useToken(deps.sql, row);
  await accounts.setPasswordHash(deps.sql, row.account_id, await hashPassword(password), true);
  await deps.credentialCache.forgetAccount(row.account_id);
  // The reset proved control of the inbox.
  await accounts.markEmailVerified(deps.sql, row.account_id);
  await recordAudit(deps.sql, { accountId: row.account_id, actor: 'system', ip }, 'account.password_reset', {
    type: 'account',
    id: row.account_id,
  });
  return { reset: true as const };
}

async function requireCurrentPassword(sql: Sql, accountId: string, password: string) {
  const account = await accounts.findAccountById(sql, accountId);
  if (!account) throw new ApiError('unauthorized');
  if (!(await verifyPassword(password, account.password_hash))) {
    throw validationFailed({ current_password: ['is not the current password'] });
  }
  return account;
}

/** Changes the password; signs out browser sessions only; API keys keep working. */
export async function changePassword(deps: AccountDeps, p: Principal, current: string, next: string) {
  await requireCurrentPassword(deps.sql, p.accountId, current);
  await accounts.setPasswordHash(deps.sql, p.accountId, await hashPassword(next), false);
  const signedOut = await sessions.deleteSessionsOfAccount(deps.sql, p.accountId);
  await deps.credentialCache.forgetAccount(p.accountId);
  await recordAudit(
    deps.sql,
    actorOf(p),
    'account.password_changed',
    { type: 'account', id: p.accountId },
    {
      sessions_invalidated: signedOut,
    },
  );
  return { sessions_invalidated: signedOut, api_keys_revoked: 0 };
}

/** Mails a confirmation link to the new address when it is free; answers the same either way. */
export async function requestEmailChange(deps: AccountDeps, p: Principal, newEmail: string, password: string) {
  const account = await requireCurrentPassword(deps.sql, p.accountId, password);
  const taken = await accounts.findAccountByEmail(deps.sql, newEmail);
  if (!taken) await mailToken(deps, account, 'email_change', newEmail, newEmail);
  await recordAudit(deps.sql, actorOf(p), 'account.email_change_requested', { type: 'account', id: p.accountId });
  return NEUTRAL.email;
}

/** Completes an email change from the link; signs out every session. */
export async function confirmEmailChange(deps: AccountDeps, token: string, ip: string | null) {
  const row = await liveToken(deps.sql, 'email_change', token);
  await useToken(deps.sql, row);
  if (!row.new_email || !(await accounts.changeEmail(deps.sql, row.account_id, row.new_email))) {
    throw new ApiError('invalid_token', 'That address has been taken meanwhile.');
  }
  await deps.credentialCache.forgetAccount(row.account_id);
  await recordAudit(deps.sql, { accountId: row.account_id, actor: 'system', ip }, 'account.email_changed', {
    type: 'account',
    id: row.account_id,
  });
  return { email: row.new_email };
}

/**
 * `GET /api/auth/me`. What the instance decides for every account: `comped` is null while
 * payment is off; `brokered` is whether the egress credential broker is on (EGRESS_BROKER).
 */
export async function identity(sql: Sql, p: Principal, instance: { paymentEnabled: boolean; brokerOn: boolean }) {
  const a = await accounts.findAccountById(sql, p.accountId);
  if (!a) throw new ApiError('unauthorized');
  return {
    id: a.id,
    email: a.email,
    created_at: a.created_at.toISOString(),
    email_verified: a.email_verified_at !== null,
    onboarding_state: a.onboarding_state,
    onboarding_completed: a.onboarding_completed_at !== null,
    comped: instance.paymentEnabled ? a.comped : null,
    brokered: instance.brokerOn,
    role: a.role,
    actor: p.actor,
    scope: p.scope === 'conversation' ? ('standard' as const) : p.scope,
  };
}

function onboardingOf(a: accounts.AccountRow) {
  return {
    state: a.onboarding_state,
    completed: a.onboarding_completed_at !== null,
    completed_at: a.onboarding_completed_at?.toISOString() ?? null,
  };
}

export async function onboarding(sql: Sql, p: Principal) {
  const a = await accounts.findAccountById(sql, p.accountId);
  if (!a) throw new ApiError('unauthorized');
  return onboardingOf(a);
}

/** Idempotent: the first call stamps `completed_at`, later calls return the same. */
export async function completeOnboarding(sql: Sql, p: Principal) {
  const before = await accounts.findAccountById(sql, p.accountId);
  const a = await accounts.completeOnboarding(sql, p.accountId);
  if (!before?.onboarding_completed_at) {
    await recordAudit(sql, actorOf(p), 'account.onboarding_completed', { type: 'account', id: p.accountId });
  }
  return onboardingOf(a);
}

/** What erasing an account needs beyond its rows: its machines, runner connections and live log. */
export interface AccountErasureDeps extends SandboxDeps {
  fabric: SandboxDeps['fabric'] & Pick<RunnerFabric, 'disconnectEverywhere'>;
  eventLog: Pick<EventLog, 'dropTenant'>;
}

/**
 * Erases the account: its sandboxes are destroyed through their provider first (runners told,
 * local runner-agents stopped, their disk removed), then every row in every tenant table goes
 * (they cascade from `accounts`) with the wrapped data key, then the account's runner
 * connections are closed on this node and every other one, and its live log (hot events,
 * marks, feeds) dropped, and its export files removed. The instance log records that an
 * account was deleted, nothing more.
 */
export async function deleteAccount(deps: AccountDeps, erasure: AccountErasureDeps, p: Principal, confirm: string) {
  const a = await accounts.findAccountById(deps.sql, p.accountId);
  if (!a) throw new ApiError('unauthorized');
  if (confirm.trim().toLowerCase() !== a.email.toLowerCase()) {
    throw validationFailed({ confirm: ["must be the account's email address"] });
  }
  await eraseAccount(deps, erasure, a.id);
}

/**
 * The erasure itself, as `deleteAccount` describes it, for a caller that already decided
 * (the account's owner after confirming, or an admin). False when there was no such account.
 */
export async function eraseAccount(
  deps: Pick<AccountDeps, 'sql' | 'log' | 'exportFiles' | 'credentialCache'>,
  erasure: AccountErasureDeps,
  accountId: string,
): Promise<boolean> {
  await destroyAccountSandboxes(erasure, accountId);
  const deleted = await accounts.deleteAccount(deps.sql, accountId);
  await deps.credentialCache.forgetAccount(accountId);
  // After the rows: a runner's token no longer works, so nothing reconnects or appends for it.
  await erasure.fabric.disconnectEverywhere({ accountId }, RUNNER_CLOSE.revoked, 'the account was deleted');
  await erasure.eventLog.dropTenant(accountId);
  await deps.exportFiles.removeAccount(accountId);
  if (deleted) deps.log.info('an account was deleted');
  return deleted;
}

export type { ActorRef };
