import { type BlockList, isIP } from 'node:net';
import {
  ApiError,
  DEFAULT_WEBHOOK_EVENT_TYPES,
  eventTypeProblem,
  newId,
  orNotFound,
  validationFailed,
  type WebhookEndpoint,
  type WebhookEndpointCreate,
  type WebhookEndpointPatch,
} from '@svc/core';
import { accounts, type Sql, transaction, webhooks } from '@svc/db';
import type { z } from 'zod';
import type { Keyring } from '../secrets/keyring.ts';
import { newSecret } from '../secrets/tokens.ts';
import { addressProblem } from '../webhooks/addresses.ts';
import { recordAudit } from './audit.ts';
import type { ActorRef } from './principal.ts';

/*
 * Webhook endpoints: where a tenant's conversation events are delivered. The signing secret is
 * stored encrypted under the account's data key and shown on create and rotate only; audit
 * rows name the endpoint and what changed, never the secret.
 */

export interface WebhookDeps {
  sql: Sql;
  keyring: Keyring;
  /** WEBHOOK_ALLOW_HTTP: plain `http://` URLs are accepted (the scheme rule only). */
  allowHttp: boolean;
  /** WEBHOOK_ALLOW_CIDRS: ranges an endpoint may point at although they are not public. */
  allowed?: BlockList;
}

type Endpoint = z.infer<typeof WebhookEndpoint>;

export function shapeEndpoint(row: webhooks.EndpointRow): Endpoint {
  return {
    id: row.id,
    url: row.url,
    description: row.description,
    event_types: row.event_types,
    status: row.status,
    disabled_reason: row.disabled_reason,
    disabled_at: row.disabled_at?.toISOString() ?? null,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}

/** The associated-data label binding a secret's ciphertext to its endpoint (see Keyring). */
const purpose = (endpointId: string) => `webhook-secret:${endpointId}`;

async function dataKey(sql: Sql, accountId: string): Promise<Uint8Array> {
  const account = await accounts.findAccountById(sql, accountId);
  if (!account) throw new ApiError('unauthorized');
  return account.data_key;
}

/** The endpoint's signing secret in plaintext, for signing a delivery. */
export async function revealSecret(
  deps: { sql: Sql; keyring: Keyring },
  accountId: string,
  endpointId: string,
  ciphertext: Uint8Array,
): Promise<string> {
  return deps.keyring.decrypt(accountId, await dataKey(deps.sql, accountId), purpose(endpointId), ciphertext);
}

/**
 * Why `url` cannot be an endpoint, or undefined when it can: `https://` (or `http://` with
 * `allowHttp`), a host, no credentials. An address written into the URL must be public (or
 * in `allowed`); a name is checked when each delivery resolves it.
 */
export function urlProblem(url: string, allowHttp: boolean, allowed?: BlockList): string | undefined {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return 'is not a URL';
  }
  if (u.protocol !== 'https:' && !(allowHttp && u.protocol === 'http:')) {
    return allowHttp
      ? 'must start with https:// or http://'
      : 'must start with https:// (an operator allows http:// with WEBHOOK_ALLOW_HTTP=true)';
  }
  if (u.username || u.password) return 'must not carry credentials (user:password@)';
  if (!u.hostname) return 'has no host';
  const literal = u.hostname.replace(/^\[|\]$/g, '');
  if (isIP(literal)) {
    const problem = addressProblem(literal, allowed);
    if (problem) {
      return `points at ${problem}, which webhooks may not reach (an operator allows a range with WEBHOOK_ALLOW_CIDRS)`;
    }
  }
  return undefined;
}

function checkFields(
  deps: WebhookDeps,
  fields: { url?: string | undefined; event_types?: string[] | undefined },
): void {
  const details: Record<string, string[]> = {};
  if (fields.url !== undefined) {
    const problem = urlProblem(fields.url, deps.allowHttp, deps.allowed);
    if (problem) details.url = [`${fields.url.replace(/\/\/[^@/]*@/, '//')} ${problem}`];
  }
  if (fields.event_types !== undefined) {
    const problems = fields.event_types.map(eventTypeProblem).filter((p): p is string => p !== undefined);
    if (problems.length) details.event_types = problems;
  }
  if (Object.keys(details).length) throw validationFailed(details);
}

/** A URL as audit rows name it: scheme, host and path, never its query (which may hold a token). */
function auditUrl(url: string): string {
  const u = new URL(url);
  return `${u.protocol}//${u.host}${u.pathname}`;
}

export async function listEndpoints(sql: Sql, accountId: string): Promise<Endpoint[]> {
  return (await webhooks.listEndpoints(sql, accountId)).map(shapeEndpoint);
}

export async function getEndpoint(sql: Sql, accountId: string, id: string): Promise<webhooks.EndpointRow> {
  return orNotFound(await webhooks.getEndpoint(sql, accountId, id), 'Webhook endpoint');
}

const newWebhookSecret = () => newSecret('whsec_');

/** Creates an endpoint; the answer is the only time its secret is shown (besides rotate). */
export async function createEndpoint(
  deps: WebhookDeps,
  who: ActorRef,
  input: z.infer<typeof WebhookEndpointCreate>,
): Promise<Endpoint & { secret: string }> {
  checkFields(deps, input);
  const eventTypes = [...new Set(input.event_types ?? DEFAULT_WEBHOOK_EVENT_TYPES)];
  const id = newId('whe');
  const secret = newWebhookSecret();
  const wrapped = await dataKey(deps.sql, who.accountId);
  const row = await transaction(deps.sql, async (tx) => {
    const created = await webhooks.insertEndpoint(tx, {
      id,
      accountId: who.accountId,
      url: input.url,
      description: input.description ?? '',
      eventTypes,
      secret: deps.keyring.encrypt(who.accountId, wrapped, purpose(id), secret),
    });
    await recordAudit(
      tx,
      who,
      'webhook.created',
      { type: 'webhook', id },
      { url: auditUrl(input.url), event_types: eventTypes },
    );
    return created;
  });
  return { ...shapeEndpoint(row), secret };
}

/**
 * Writes the fields given. `status: active` resumes a disabled endpoint (as `resumeEndpoint`
 * does: the failure count starts again from 0); `disabled` stops delivery by hand.
 */
export async function updateEndpoint(
  deps: WebhookDeps,
  who: ActorRef,
  id: string,
  patch: z.infer<typeof WebhookEndpointPatch>,
): Promise<Endpoint> {
  checkFields(deps, patch);
  const before = await getEndpoint(deps.sql, who.accountId, id);
  const resumes = patch.status === 'active' && before.status === 'disabled';
  const row = await transaction(deps.sql, async (tx) => {
    const updated = orNotFound(
      await webhooks.updateEndpoint(tx, who.accountId, id, {
        url: patch.url,
        description: patch.description,
        eventTypes: patch.event_types === undefined ? undefined : [...new Set(patch.event_types)],
        status: patch.status,
        disabledReason: patch.status === 'disabled' ? 'disabled through the API' : undefined,
      }),
      'Webhook endpoint',
    );
    await recordAudit(
      tx,
      who,
      'webhook.updated',
      { type: 'webhook', id },
      {
        fields: Object.keys(patch).sort(),
        ...(patch.url === undefined ? {} : { url: auditUrl(patch.url) }),
        ...(patch.event_types === undefined ? {} : { event_types: updated.event_types }),
        ...(patch.status === undefined ? {} : { status: patch.status }),
      },
    );
    if (resumes) await recordAudit(tx, who, 'webhook.resumed', { type: 'webhook', id }, { via: 'patch' });
    return updated;
  });
  return shapeEndpoint(row);
}

/**
 * Makes the endpoint active with its failure count reset, and audits it (`webhook.resumed`),
 * whether it was disabled or active: resuming an active endpoint clears its run of failures.
 */
export async function resumeEndpoint(deps: WebhookDeps, who: ActorRef, id: string): Promise<Endpoint> {
  await getEndpoint(deps.sql, who.accountId, id);
  const row = await transaction(deps.sql, async (tx) => {
    const updated = orNotFound(
      await webhooks.updateEndpoint(tx, who.accountId, id, { status: 'active' }),
      'Webhook endpoint',
    );
    await recordAudit(tx, who, 'webhook.resumed', { type: 'webhook', id }, { via: 'resume' });
    return updated;
  });
  return shapeEndpoint(row);
}

/** Deletes the endpoint with its queued jobs and delivery history. */
export async function deleteEndpoint(deps: WebhookDeps, who: ActorRef, id: string): Promise<void> {
  await transaction(deps.sql, async (tx) => {
    orNotFound(await webhooks.deleteEndpoint(tx, who.accountId, id), 'Webhook endpoint');
    await recordAudit(tx, who, 'webhook.deleted', { type: 'webhook', id });
  });
}

/** A new secret; from now on every delivery (retries of older events too) is signed with it only. */
export async function rotateSecret(
  deps: WebhookDeps,
  who: ActorRef,
  id: string,
): Promise<Endpoint & { secret: string }> {
  await getEndpoint(deps.sql, who.accountId, id);
  const secret = newWebhookSecret();
  const wrapped = await dataKey(deps.sql, who.accountId);
  const row = await transaction(deps.sql, async (tx) => {
    const updated = orNotFound(
      await webhooks.updateEndpoint(tx, who.accountId, id, {
        secret: deps.keyring.encrypt(who.accountId, wrapped, purpose(id), secret),
      }),
      'Webhook endpoint',
    );
    await recordAudit(tx, who, 'webhook.secret_rotated', { type: 'webhook', id });
    return updated;
  });
  return { ...shapeEndpoint(row), secret };
}
