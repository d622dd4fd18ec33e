import { createHmac, timingSafeEqual } from 'node:crypto';

/*
 * Webhook event types, and the signature both sides compute: the service signs each delivery,
 * a receiver checks it with `verifyWebhookSignature` (exported for receivers written in
 * TypeScript; README shows the same check for Node and for Python's standard library).
 */

/** Each stage a webhook can report and its states (SPEC Events / Webhook events). */
export const WEBHOOK_STAGES = {
  provision: ['started', 'done', 'failed'],
  clone: ['started', 'done', 'failed'],
  packages: ['started', 'done', 'failed'],
  network: ['started', 'done', 'failed'],
  broker: ['started', 'done', 'failed'],
  setup: ['started', 'done', 'failed'],
  checkpoint_restore: ['started', 'done', 'failed'],
  reattach: ['started', 'done', 'failed', 'interrupted'],
  turn: ['started', 'done', 'failed', 'interrupted'],
  request: ['started', 'done'],
  model: ['failed'],
  session: ['done'],
  sandbox: ['done'],
  terminate: ['done'],
} as const satisfies Record<string, readonly string[]>;

/** Sent by `POST /api/webhooks/:id/test`, to every endpoint whatever its `event_types`. */
export const WEBHOOK_TEST_TYPE = 'webhook.test';

/** Every exact type an endpoint may name: `conversation.<stage>.<state>`. */
export const WEBHOOK_EVENT_TYPES: readonly string[] = Object.entries(WEBHOOK_STAGES).flatMap(([stage, states]) =>
  states.map((state) => `conversation.${stage}.${state}`),
);

/** What an endpoint created without `event_types` receives (SPEC Webhooks). */
export const DEFAULT_WEBHOOK_EVENT_TYPES = [
  'conversation.turn.done',
  'conversation.turn.failed',
  'conversation.provision.failed',
] as const;

/** The webhook type of a log stage event: `conversation.<stage>.<state>`. */
export function webhookTypeOf(stage: string, state: string): string {
  return `conversation.${stage}.${state}`;
}

/**
 * Why an `event_types` entry cannot be saved, or undefined when it can: an exact type from
 * WEBHOOK_EVENT_TYPES, one stage (`conversation.turn.*`), or everything (`*`).
 */
export function eventTypeProblem(entry: string): string | undefined {
  if (entry === '*' || WEBHOOK_EVENT_TYPES.includes(entry)) return undefined;
  const stage = /^conversation\.([a-z_]+)\.\*$/.exec(entry)?.[1];
  if (stage !== undefined) {
    return Object.hasOwn(WEBHOOK_STAGES, stage) ? undefined : `${entry}: no stage named ${stage}`;
  }
  return `${entry} is not an event type (an exact type such as conversation.turn.done, a stage such as conversation.turn.*, or *)`;
}

/** Whether an endpoint subscribed to `patterns` (each passing eventTypeProblem) wants `type`. */
export function eventTypeMatches(patterns: readonly string[], type: string): boolean {
  return patterns.some((p) => p === '*' || p === type || (p.endsWith('.*') && type.startsWith(p.slice(0, -1))));
}

export const SIGNATURE_HEADER = 'Svc-Signature';
/** How far a signature's `t` may be from the receiver's clock, either way. */
export const SIGNATURE_TOLERANCE_S = 300;

function hmacHex(secret: string, t: number, body: string | Uint8Array): string {
  return createHmac('sha256', secret).update(`${t}.`).update(body).digest('hex');
}

/** The `Svc-Signature` value for `body` sent at `t` (unix seconds): `t=<t>,v1=<hex>`. */
export function signWebhook(secret: string, body: string | Uint8Array, t: number): string {
  return `t=${t},v1=${hmacHex(secret, t, body)}`;
}

export type VerifyResult = { ok: true; t: number } | { ok: false; reason: string };

/**
 * Checks a delivery on the receiving side. `header` is the `Svc-Signature` value, `body` the
 * raw bytes as received (before any JSON parse), `secret` the endpoint's. Pairs are read by
 * name, so a later scheme added beside `v1` (or several `v1` during a rotation) does not break
 * it; any `v1` that matches is enough. Compared in constant time. A `t` further than
 * `toleranceS` from `nowS` (unix seconds) is refused, so a captured delivery cannot be replayed
 * later. Never throws.
 */
export function verifyWebhookSignature(options: {
  header: string | null | undefined;
  body: string | Uint8Array;
  secret: string;
  nowS?: number;
  toleranceS?: number;
}): VerifyResult {
  const { header, body, secret } = options;
  if (!header) return { ok: false, reason: 'no signature header' };
  let t: number | undefined;
  const v1: string[] = [];
  for (const part of header.split(',')) {
    const eq = part.indexOf('=');
    if (eq < 0) continue;
    const name = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (name === 't' && /^\d{1,12}$/.test(value)) t = Number(value);
    else if (name === 'v1') v1.push(value);
  }
  if (t === undefined) return { ok: false, reason: 'no timestamp in the signature' };
  if (v1.length === 0) return { ok: false, reason: 'no v1 signature' };
  const now = options.nowS ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - t) > (options.toleranceS ?? SIGNATURE_TOLERANCE_S)) {
    return { ok: false, reason: 'timestamp outside the tolerance' };
  }
  const expected = Buffer.from(hmacHex(secret, t, body), 'hex');
  for (const candidate of v1) {
    const given = /^[0-9a-f]{64}$/i.test(candidate) ? Buffer.from(candidate, 'hex') : undefined;
    if (given && timingSafeEqual(given, expected)) return { ok: true, t };
  }
  return { ok: false, reason: 'signature does not match' };
}
