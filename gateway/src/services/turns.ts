import {
  ApiError,
  AVATAR_TYPES,
  blocksOf,
  PROMPT_IMAGE_MAX_BYTES,
  sniffImage,
  type TurnError,
  type TurnErrorCode,
  tooLarge,
} from '@svc/core';
import { conversations, outbox, type Sql, sandboxes } from '@svc/db';
import { RUNNER_STAYED_AWAY } from '../fabric/presence.ts';
import type { Redaction } from '../log/log.append.ts';
import type { EventLog, LogEvent } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import type { AdriftTurnEnd, SandboxProvider, SandboxProviders } from '../sandboxes/provider.ts';
import { recordAudit } from './audit.ts';
import { type Billing, chargeEndedTurn } from './billing.ts';
import { endTurnResolvingRequests } from './permissions.ts';
import { stageEvent } from './stage-events.ts';
import { changed } from './tenant-events.ts';

/*
 * A turn's whole life as the records keep it: opened with its prompt (openTurn), finished
 * with the runtime's result (finishTurn), failed when it could not start (failTurnStart) or
 * when its runner stayed away (failTurnsOfRunner), ended when nothing will end it any more
 * (endTurnsAdrift, or endTurnsOfLostMachines at once when a start finds its machine gone), and
 * picked up again when its runner comes back (reattached). Every end is
 * compare-and-set on `running`, so a turn ends once, and says why in the log and the audit.
 */

/** Runtimes whose sandbox runs one turn at a time (SPEC launch rule 2). */
const ONE_TURN_PER_SANDBOX = new Set(['opencode', 'gemini']);

/**
 * Images sent with a prompt, decoded and checked by their bytes: each must be png, jpeg, gif
 * or webp and agree with its declared type (415), and fit in 5 MB (413).
 */
export function decodeImages(images: { data: string; media_type: string }[] | undefined) {
  return (images ?? []).map((image, i) => {
    const declared = image.media_type.split(';')[0]?.trim().toLowerCase() ?? '';
    const bytes = Buffer.from(image.data, 'base64');
    if (bytes.length > PROMPT_IMAGE_MAX_BYTES) {
      throw tooLarge(`images[${i}]`, PROMPT_IMAGE_MAX_BYTES, bytes.length);
    }
    const sniffed = sniffImage(bytes);
    if (!sniffed || sniffed !== declared) {
      throw new ApiError(
        'unsupported_media_type',
        sniffed
          ? `images[${i}] is ${sniffed}, not ${image.media_type}.`
          : `images[${i}] is not an image of ${AVATAR_TYPES.join(', ')}.`,
      );
    }
    return { mediaType: sniffed, data: bytes };
  });
}

/** What a turn is refused for, as the error the caller gets. */
function refusal(reason: conversations.TurnRefusal): ApiError {
  switch (reason) {
    case 'busy':
      return new ApiError('conversation_busy');
    case 'terminated':
      return new ApiError('conversation_terminated');
    case 'at_capacity':
      return new ApiError('sandbox_at_capacity', 'Another conversation on this sandbox is running a turn.');
    case 'missing':
      return new ApiError('not_found', 'Conversation not found.');
  }
}

/**
 * Opens a turn inside the caller's transaction: the conversation becomes `running` with it.
 * Refused (nothing written) while a turn runs (400 `conversation_busy`), after the
 * conversation ended (410), or while another conversation runs a turn on a sandbox whose
 * runtime runs one turn at a time (409 `sandbox_at_capacity`, SPEC launch rule 2; `shared`
 * says the sandbox already existed, so another conversation may be on it).
 */
export async function openTurn(
  tx: Sql,
  t: {
    id: string;
    accountId: string;
    conversationId: string;
    prompt: string;
    images: { mediaType: string; data: Buffer }[];
    runtime: string;
    shared: boolean;
  },
): Promise<conversations.TurnRow> {
  const turn = await conversations.startTurn(tx, {
    id: t.id,
    accountId: t.accountId,
    conversationId: t.conversationId,
    prompt: t.prompt,
    origin: 'user',
    images: t.images,
    oneTurnPerSandbox: t.shared && ONE_TURN_PER_SANDBOX.has(t.runtime),
  });
  if (typeof turn === 'string') throw refusal(turn);
  return turn;
}

/** The prompt of an autonomous turn: a marker saying where it came from, not a person's words. */
export const AUTONOMOUS_TURN_PROMPT = '(the agent kept working after its last answer)';

/**
 * Records the autonomous turn a runner opened for a conversation whose runtime spoke while no
 * turn ran (runner protocol: AUTONOMOUS_TURN_DATA): origin `autonomous`, the marker prompt,
 * and the conversation `running` until the runner ends it like any turn (finishTurn stores
 * its reply). Idempotent: a resend finds the turn on record. Nothing is
 * recorded when the conversation ended, or when a user's turn already runs (its `turn.start`
 * is on its way to the runner, which ends the autonomous turn before it): its output stays
 * in the log under the runner's id. An id that is not a turn id (`trn_` and a ULID), or that
 * names a turn of another account, records nothing either: a runner cannot take a turn it did
 * not open. True when the turn was recorded now.
 */
export async function openAutonomousTurn(
  deps: { sql: Sql },
  accountId: string,
  conversationId: string,
  turnId: string,
): Promise<boolean> {
  if (!RUNNER_TURN_ID.test(turnId)) return false;
  if (await conversations.getTurn(deps.sql, accountId, turnId)) return false;
  try {
    const turn = await conversations.startTurn(
      deps.sql,
      { id: turnId, accountId, conversationId, prompt: AUTONOMOUS_TURN_PROMPT, origin: 'autonomous' },
      [changed('conversations')],
    );
    return typeof turn !== 'string';
  } catch (err) {
    // The id is another account's turn (unique violation); anything else is the database's failure.
    if ((err as { code?: string }).code === '23505') return false;
    throw err;
  }
}

/** A turn id as a runner names an autonomous turn (`newId('trn')`). */
const RUNNER_TURN_ID = /^trn_[0-9a-z]{26}$/;

/**
 * A user's prompt arrived while the conversation's autonomous turn runs: that turn ends
 * `done` here with the reply the log holds so far, so the user's turn can open at once (the
 * runner ends it too before it starts the user's turn; that later end finds it ended). False
 * when no autonomous turn runs.
 */
export async function endAutonomousTurnForPrompt(
  deps: { sql: Sql; log: EventLog; redaction: Pick<Redaction, 'secretsOf'>; billing?: Billing | null },
  accountId: string,
  conversationId: string,
): Promise<boolean> {
  const running = await conversations.runningTurn(deps.sql, accountId, conversationId);
  if (running?.origin !== 'autonomous') return false;
  await finishTurn(deps, accountId, running.id, 'done', null);
  return true;
}

/**
 * The `turn` stage event that ends a turn the service ended itself: `error` says why, and a
 * failed turn's `code` (TURN_ERROR_CODES) goes beside it, as the runner reports its failures.
 */
export function turnEndEvent(
  conversationId: string,
  turnId: string,
  state: string,
  error: string,
  code?: TurnErrorCode,
) {
  return {
    conversationId,
    turnId,
    kind: 'stage',
    stream: 'stage',
    stage: 'turn',
    state,
    data: JSON.stringify(code ? { usage: null, code, error } : { usage: null, error }),
  };
}

/**
 * The launch or turn could not start after the answer: say so in the log, end the turn
 * `failed` with `error` on its record, and fail the sandbox whose build it was.
 */
export async function failTurnStart(
  sql: Sql,
  accountId: string,
  conversationId: string,
  sandboxId: string | null,
  turnId: string | null,
  error: TurnError,
  /** The stage that failed, when it is not the build's (`sandbox`) or the turn's: `reattach` for a wake. */
  stage?: string,
) {
  const { message } = error;
  if (sandboxId) await sandboxes.moveStatus(sql, sandboxId, ['provisioning'], 'failed');
  await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    await outbox.enqueue(t, accountId, [
      {
        conversationId,
        turnId,
        kind: 'stage',
        stream: 'stage',
        stage: stage ?? (sandboxId ? 'sandbox' : 'turn'),
        state: 'failed',
        data: stage || sandboxId ? message : JSON.stringify({ usage: null, code: error.code, error: message }),
      },
      // A failed wake also says, in the turn's own terms, that the turn did not run.
      ...(stage && turnId ? [turnEndEvent(conversationId, turnId, 'failed', message, error.code)] : []),
    ]);
  });
  if (
    turnId &&
    (await conversations.endTurn(sql, accountId, turnId, 'failed', null, [changed('conversations')], null, error))
  ) {
    await auditTurnEnd(sql, accountId, turnId, 'failed', 'launch_failed');
  }
}

/**
 * Ends a running turn with its result, usage and, when it failed, why (`error`, as the runner
 * reported it); its reply is read from the log and stored. The conversation goes idle, and its
 * watchers hear `conversations` changed; a permission request of the turn still pending is
 * resolved (`turn_end`), and the turn is charged its metered time (`billing`; once per turn).
 * False when the turn had already ended (a turn ends once).
 */
export async function finishTurn(
  deps: { sql: Sql; log: EventLog; redaction: Pick<Redaction, 'secretsOf'>; billing?: Billing | null },
  accountId: string,
  turnId: string,
  state: 'done' | 'failed' | 'interrupted' | 'timeout',
  usage: conversations.TurnRow['usage'],
  error: TurnError | null = null,
): Promise<boolean> {
  const turn = await conversations.getTurn(deps.sql, accountId, turnId);
  if (turn?.state !== 'running') return false;
  const reply = await replyOf(deps, accountId, turn.conversation_id, turnId);
  // The runner's words are stored as they reach the log: redacted (the reply is read from it).
  const secrets = await deps.redaction.secretsOf(accountId, turn.conversation_id);
  const why = error && secrets ? { ...error, message: secrets.redact(error.message) } : error;
  const ended = await endTurnResolvingRequests(
    deps.sql,
    accountId,
    turnId,
    state,
    usage,
    [changed('conversations')],
    reply,
    state === 'failed' ? why : null,
  );
  if (ended) {
    await auditTurnEnd(deps.sql, accountId, turnId, state);
    await chargeEndedTurn(deps.sql, deps.billing, accountId, turnId);
  }
  return ended;
}

/** The audit row of a turn's end (actor `system`: the runtime or the service ended it). */
function auditTurnEnd(sql: Sql, accountId: string, turnId: string, state: string, reason?: string) {
  return recordAudit(
    sql,
    { accountId, actor: 'system', ip: null },
    'turn.ended',
    { type: 'turn', id: turnId },
    reason ? { state, reason } : { state },
  );
}

/** How much of a turn's reply is stored (the search index needs no more). */
const REPLY_MAX_CHARS = 200_000;

/**
 * A turn's reply: the text of its agent messages, in order, as the log holds them (redacted).
 * The runner sends a turn's end after everything the turn said, and the fabric ends the record
 * only once what came before the end is appended, so the reply is whole. It reads the
 * conversation's log from the start: fine at turn ends, worth an index on long conversations.
 */
export async function replyOf(
  deps: { sql: Sql; log: EventLog },
  accountId: string,
  conversationId: string,
  turnId: string,
): Promise<string> {
  let reply = '';
  let after = 0;
  for (;;) {
    const page = await readLog(deps, accountId, { conversationId, after, limit: 1000 });
    for (const e of page) {
      if (e.turnId !== turnId || e.stream !== 'acp') continue;
      for (const b of blocksOf(e)) if (b.kind === 'text') reply += b.body;
    }
    if (page.length < 1000 || reply.length >= REPLY_MAX_CHARS) break;
    after = (page.at(-1) as LogEvent).id;
  }
  return reply.slice(0, REPLY_MAX_CHARS);
}

/**
 * A runner stayed away past the grace period: each turn still running on its sandboxes ends
 * `failed` with a `turn` stage event saying why (compare-and-set: a turn the runner finished
 * in time is left alone), and its sandboxes are failed. Nothing is left `running`.
 */
export async function failTurnsOfRunner(sql: Sql, runnerId: string): Promise<number> {
  let failed = 0;
  const error: TurnError = {
    code: 'runner_offline',
    message: RUNNER_STAYED_AWAY,
  };
  for (const t of await conversations.runningTurnsOnRunner(sql, runnerId)) {
    const ended = await endTurnResolvingRequests(
      sql,
      t.account_id,
      t.turn_id,
      'failed',
      null,
      [turnEndEvent(t.conversation_id, t.turn_id, 'failed', error.message, error.code), changed('conversations')],
      null,
      error,
    );
    if (ended) {
      failed++;
      await auditTurnEnd(sql, t.account_id, t.turn_id, 'failed', 'runner_gone');
    }
    await sandboxes.moveStatus(sql, t.sandbox_id, ['provisioning', 'ready'], 'failed');
  }
  return failed;
}

/**
 * Ends the turns nothing will end any more (`runningTurnsAdrift`): their runner has not been
 * heard from for `graceMs`, as after a restart of the service when the runner did not come
 * back. How each ends is its sandbox provider's (`adrift`: a local runner-agent went with the
 * service, so its turn is `interrupted`; a self-hosted runner that stayed away fails it). Each
 * says why in the log (stage `reattach` failed); compare-and-set, so a turn that ended
 * meanwhile is left alone. A turn whose sandbox's provider may still be starting its machine
 * is left to that start (`startTimeoutMs`) for a grace period more. A turn whose runner came
 * back without the machine (it was killed mid-turn, so nothing it resent ended the turn) ends
 * `interrupted` once its sandbox was settled a grace period ago.
 */
export async function endTurnsAdrift(
  deps: { sql: Sql; providers: SandboxProviders },
  graceMs: number,
): Promise<number> {
  const { sql } = deps;
  const now = Date.now();
  let ended = 0;
  for (const t of await conversations.runningTurnsAdrift(sql, new Date(now - graceMs), new Date(now - 2 * graceMs))) {
    const provider = deps.providers.of(t.provider);
    if (t.starting && t.opened_at.getTime() > now - provider.startTimeoutMs - graceMs) continue;
    if (await endTurnAdrift(sql, t, t.restarted ? RESTARTED_MID_TURN : provider.adrift)) ended++;
  }
  return ended;
}

/** How a turn ends whose runner came back without its machine (killed, then started again). */
const RESTARTED_MID_TURN: AdriftTurnEnd = {
  state: 'interrupted',
  error: 'The runner restarted while this turn ran, and its runtime went with it: send the prompt again.',
  reason: 'runner_restarted',
};

/**
 * The machines behind `runnerIds` are gone for good (their provider says so at start, see
 * `SandboxProvider.lostAtStart`): their running turns end at once, as `endTurnsAdrift` would
 * end them a grace period or two later. Resolves to how many it ended.
 */
export async function endTurnsOfLostMachines(
  deps: { sql: Sql },
  provider: Pick<SandboxProvider, 'adrift'>,
  runnerIds: string[],
): Promise<number> {
  let ended = 0;
  for (const runnerId of runnerIds) {
    for (const t of await conversations.runningTurnsOnRunner(deps.sql, runnerId)) {
      if (await endTurnAdrift(deps.sql, t, provider.adrift)) ended++;
    }
  }
  return ended;
}

/**
 * Ends one turn whose machine will not end it, saying why (stage `reattach` failed, then the
 * `turn` stage in the provider's terms), and fails its sandbox so the next prompt builds a
 * new machine. Compare-and-set: false when the turn had ended meanwhile.
 */
async function endTurnAdrift(
  sql: Sql,
  t: { account_id: string; turn_id: string; conversation_id: string; sandbox_id: string },
  { state, error, reason }: AdriftTurnEnd,
): Promise<boolean> {
  const failed = state === 'failed' ? ({ code: 'runner_offline', message: error } as const) : null;
  const done = await endTurnResolvingRequests(
    sql,
    t.account_id,
    t.turn_id,
    state,
    null,
    [
      stageEvent(t.conversation_id, t.turn_id, 'reattach', 'failed', error),
      turnEndEvent(t.conversation_id, t.turn_id, state, error, failed?.code),
      changed('conversations'),
    ],
    null,
    failed,
  );
  if (done) await auditTurnEnd(sql, t.account_id, t.turn_id, state, reason);
  await sandboxes.moveStatus(sql, t.sandbox_id, ['provisioning', 'ready'], 'failed');
  return done;
}

/**
 * A runner connected holding sandboxes: the conversations running a turn on them are
 * reattached (stage `reattach` done), and their turns go on.
 */
export async function reattached(sql: Sql, runnerId: string, sandboxIds: string[]): Promise<void> {
  for (const t of await conversations.runningTurnsOnSandboxes(sql, runnerId, sandboxIds)) {
    await sql.begin((tx) =>
      outbox.enqueue(tx as unknown as Sql, t.account_id, [
        stageEvent(t.conversation_id, t.turn_id, 'reattach', 'done'),
      ]),
    );
  }
}
