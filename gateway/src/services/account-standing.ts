import { ApiError } from '@svc/core';
import { accounts, type Sql } from '@svc/db';

/** Why a suspended account's work does not start; a scheduled run records this as `last_error`. */
export const SUSPENDED_MESSAGE = 'This account is suspended; nothing runs for it until an admin restores it.';

/**
 * The suspension gate of new work. Every launch and every prompt passes it (startConversation
 * and sendPrompt call it), so every path that starts work does: the API, team messages and the
 * team tools, scheduled runs. A suspended account is refused 403 `account_suspended`. Its keys
 * and sessions are already refused when they authenticate; what this stops is work nobody asks
 * for at that moment (a schedule firing as `system`) and a request that authenticated just
 * before the suspension.
 *
 * Called twice by a launch: first, before anything is written, so nothing else happens for a
 * suspended account; then inside the transaction that records the work, where it reads the
 * account row under a share lock: a suspension that committed meanwhile is seen there (the
 * launch rolls back), and one that commits later waits for the launch to commit, so the
 * suspension's sweep of active sandboxes (admin.setSuspended) finds and reaps the one it
 * recorded. Either way the sweep misses no sandbox a launch recorded.
 */
export async function refuseIfSuspended(sql: Sql, accountId: string): Promise<void> {
  if (await accounts.suspendedForShare(sql, accountId)) throw new ApiError('account_suspended', SUSPENDED_MESSAGE);
}
