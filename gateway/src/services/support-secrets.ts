import { REDACTED, SecretSet } from '@svc/core';
import { environments, type Sql, vaults } from '@svc/db';
import type { Keyring } from '../secrets/keyring.ts';
import { PROVIDERS, revealCredential } from './inference-credentials.ts';
import { revealSecrets } from './secrets.ts';

/**
 * A support report never carries a secret (SPEC: context is "never a secret"), since it is
 * kept as the operator's inbox and forwarded to an issue tracker and a mailbox. What a
 * reporter pastes by mistake is replaced by `[REDACTED]` before the report is stored:
 * - every value of 8 bytes or more that the account holds as a secret: environment and vault
 *   secrets and inference credentials (the sandbox redaction's length rule). Plain environment
 *   variables are not secrets, and a value such as `production` must stay readable here;
 * - anything shaped like a credential this service issues or stores (API, OAuth, sandbox,
 *   session and runner tokens, webhook signing secrets), whoever's it is;
 * - in `context`, every value under a key that names a secret (`password`, `token`, ...).
 */
export interface ReportScrubber {
  text(s: string): string;
  context(value: Record<string, unknown>): Record<string, unknown>;
}

// Every credential format the service issues or stores: its bearer credentials (a `svc` prefix
// and 32 random bytes in base64url, 43 chars) and webhook signing secrets (`whsec_`, ours of the
// same length, a payment provider's of its own).
const ISSUED_CREDENTIAL = /\b(?:svc(?:o|s|sess|r)?_[A-Za-z0-9_-]{43}|whsec_[A-Za-z0-9_+/=-]{16,})/g;
const SECRET_KEY = /pass(?:word|wd)?|secret|token|api[-_]?key|authori[sz]ation|cookie|credential|private[-_]?key/i;

export async function reportScrubber(deps: { sql: Sql; keyring: Keyring }, accountId: string): Promise<ReportScrubber> {
  const values = await accountSecretValues(deps, accountId);
  const set = new SecretSet(values);
  const text = (s: string) => set.redact(s).replace(ISSUED_CREDENTIAL, REDACTED);
  const walk = (value: unknown): unknown => {
    if (typeof value === 'string') return text(value);
    if (Array.isArray(value)) return value.map(walk);
    if (value !== null && typeof value === 'object') {
      return Object.fromEntries(
        Object.entries(value).map(([k, v]) => [text(k), SECRET_KEY.test(k) && v !== null ? REDACTED : walk(v)]),
      );
    }
    return value;
  };
  return { text, context: (value) => walk(value) as Record<string, unknown> };
}

/** Every secret value the account holds (decrypted in memory only, to be recognised). */
async function accountSecretValues(deps: { sql: Sql; keyring: Keyring }, accountId: string): Promise<string[]> {
  const values: string[] = [];
  for (const env of await environments.listEnvironments(deps.sql, accountId)) {
    values.push(...Object.values(await revealSecrets(deps, 'environment', accountId, env.id)));
  }
  for (const vault of await vaults.listVaults(deps.sql, accountId)) {
    values.push(...Object.values(await revealSecrets(deps, 'vault', accountId, vault.id)));
  }
  for (const provider of PROVIDERS) {
    const value = await revealCredential(deps, accountId, provider);
    if (value) values.push(value);
  }
  return values;
}
