/**
 * The error catalogue: every error code the API can answer with, its HTTP status and a
 * default message. Code throws `new ApiError('conversation_busy')`; one handler in the api
 * role turns it into the `{error, message}` body. SPEC.md "Errors" and DECISIONS.md "Errors"
 * are the sources; a test checks that every code SPEC.md names is listed here.
 */
export const errorCatalogue = {
  invalid_request: [400, 'The request could not be parsed.'],
  conversation_busy: [400, 'A turn is still running on this conversation.'],
  invalid_status: [400, 'Unknown status value.'],
  invalid_grant: [400, 'The authorization code or PKCE verifier is not valid.'],
  unsupported_grant_type: [400, 'Only the authorization_code grant is supported.'],
  unauthorized: [401, 'Authentication is missing or invalid.'],
  insufficient_credits: [402, 'The account has no credit left.'],
  contact_limit_reached: [402, 'The team contact ceiling is reached.'],
  forbidden: [403, 'This credential may not do that.'],
  email_not_verified: [403, 'Verify your email address first; the link is in your inbox.'],
  account_suspended: [403, 'This account is suspended.'],
  sprite_may_not_answer: [403, 'A sandbox token may not answer permission requests.'],
  not_found: [404, 'Nothing found.'],
  sandbox_not_found: [404, 'Sandbox not found.'],
  team_comms_not_enabled: [404, 'Team comms are not enabled for this account.'],
  method_not_allowed: [405, 'Method not allowed.'],
  no_runner_online: [409, 'No runner is online.'],
  sandbox_at_capacity: [409, 'The sandbox runs one turn at a time.'],
  sandbox_not_attachable: [409, 'The sandbox cannot take another conversation.'],
  sandbox_mid_turn: [409, 'A conversation on this sandbox is running a turn.'],
  permission_request_resolved: [409, 'The permission request was already resolved.'],
  contact_already_provisioned: [409, 'The teammate already has a contact.'],
  environment_in_use: [409, 'Agents still use this environment; move them first.'],
  binding_exists: [409, 'A binding of this secret name to this host already exists.'],
  conversation_terminated: [410, 'The conversation has ended; do not retry.'],
  payload_too_large: [413, 'The request body is too large.'],
  unsupported_media_type: [415, 'Unsupported media type.'],
  validation_failed: [422, 'Some fields are not valid.'],
  invalid_token: [422, 'The token is not valid.'],
  expired: [422, 'The token has expired.'],
  unknown_option: [422, 'That option was not offered.'],
  sandbox_identity_mismatch: [422, 'The sandbox was built for another agent, environment or vault.'],
  sandbox_not_resettable: [422, 'Only a live persistent sandbox can be reset.'],
  no_openai_key: [422, 'Set an OpenAI credential first.'],
  missing_credential: [422, "Set an inference credential for the agent's model provider first."],
  invalid: [422, 'The provider rejected the credential.'],
  account_comped: [422, 'A comped account is never charged; it needs no credit.'],
  provider_error: [424, 'An upstream provider failed.'],
  rate_limited: [429, 'Too many requests; retry later.'],
  sandbox_quota_exceeded: [429, 'The account has reached its sandbox quota.'],
  internal_error: [500, 'Internal error.'],
  network: [502, 'The provider could not be reached.'],
  not_ready: [503, 'The service is not ready: a dependency it needs does not answer.'],
  fleet_full: [503, 'The instance has no free sandbox capacity.'],
  provisioning: [503, 'The machine is still being built.'],
  sprite_probe_failed: [503, 'The sandbox did not answer its probe.'],
  runner_offline: [503, 'The runner behind this sandbox is offline.'],
  team_comms_not_configured: [503, 'This instance has no team comms provider keys.'],
  timeout: [504, 'The provider did not answer in time.'],
} as const satisfies Record<string, readonly [number, string]>;

export type ErrorCode = keyof typeof errorCatalogue;

export function statusOf(code: ErrorCode): number {
  return errorCatalogue[code][0];
}

/**
 * An error the API answers with. `extra` fields are merged into the body beside `error` and
 * `message` (for example `details`, `provider_status`, `upgrade_url`). `retryAfter` (seconds)
 * becomes the `Retry-After` header; every 429 and 503 carries one.
 */
export class ApiError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly extra: Record<string, unknown> | undefined;
  readonly retryAfter: number | undefined;

  constructor(
    code: ErrorCode,
    message?: string,
    options: { extra?: Record<string, unknown>; retryAfter?: number } = {},
  ) {
    super(message ?? errorCatalogue[code][1]);
    this.name = 'ApiError';
    this.code = code;
    this.status = statusOf(code);
    this.extra = options.extra;
    this.retryAfter = options.retryAfter ?? (this.status === 429 || this.status === 503 ? 1 : undefined);
  }

  body(): Record<string, unknown> {
    return { error: this.code, message: this.message, ...this.extra };
  }
}

/** A size in words: whole MB or KB (of 1024) when it is one, else bytes. */
function sizeInWords(bytes: number): string {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) === 0) return `${bytes / (1024 * 1024)} MB`;
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KB`;
  return `${bytes} bytes`;
}

/**
 * A 413 `payload_too_large` in the one wording every limit uses: what is too large, its size
 * when known, and the limit, also as `limit_bytes`.
 */
export function tooLarge(what: string, limitBytes: number, sizeBytes?: number): ApiError {
  const size = sizeBytes === undefined ? 'is larger than' : `is ${sizeBytes} bytes, more than`;
  return new ApiError('payload_too_large', `${what} ${size} the limit of ${sizeInWords(limitBytes)}.`, {
    extra: { limit_bytes: limitBytes },
  });
}

/** A 422 `validation_failed` whose `details` maps field paths to messages (DECISIONS.md). */
export function validationFailed(details: Record<string, string[]>, message?: string): ApiError {
  return new ApiError('validation_failed', message, { extra: { details } });
}

/**
 * `value` itself when it is there (a row, or `true` from a write that touched one); otherwise a
 * 404 `not_found` saying "`what` not found.". Another tenant's row reads as missing, so its id
 * answers exactly as an unknown one does.
 */
export function orNotFound<T>(value: T | null | undefined | false, what: string): T {
  if (!value) throw new ApiError('not_found', `${what} not found.`);
  return value;
}
