import { AUTONOMOUS_TURN_DATA, newId, type RunnerEvent } from '@svc/core';

/** How long a runtime stays quiet before its autonomous turn ends, when the service names none. */
export const AUTONOMOUS_IDLE_MS_DEFAULT = 3000;
/** How long an autonomous turn may last, when no `turn.start` named a time limit. */
const AUTONOMOUS_LIMIT_MS_DEFAULT = 30 * 60_000;

/**
 * ACP session updates that report on the session (its context window, commands, mode,
 * options, title) rather than carry the agent's work. Runtimes send them when they like:
 * codex-acp's `usage_update` for a prompt may come after the prompt's answer. They open no
 * autonomous turn; one that comes while none runs goes to the turn that started last.
 */
const SESSION_STATE_UPDATES = new Set([
  'usage_update',
  'available_commands_update',
  'current_mode_update',
  'config_option_update',
  'session_info_update',
]);

/** Whether a `session/update`'s params carry the agent's work (anything but SESSION_STATE_UPDATES). */
export function isAgentWork(params: unknown): boolean {
  const kind = (params as { update?: { sessionUpdate?: unknown } } | null)?.update?.sessionUpdate;
  return !(typeof kind === 'string' && SESSION_STATE_UPDATES.has(kind));
}

type Why = 'idle' | 'prompt' | 'closed' | 'interrupted' | 'timeout';

/**
 * The autonomous turn of one conversation: what its runtime says while none of its turns runs
 * (an agent that keeps working after its answer) goes into a turn the runner opens for it, so
 * nothing it says lands outside a turn. The turn opens (stage `turn` started, data
 * `AUTONOMOUS_TURN_DATA`, an id the runner chose) at the first such update, and ends `done`
 * (`{"usage": null, "stop_reason": "idle" | "prompt" | "closed"}`) once the runtime has been
 * quiet for the idle time, when a user's turn is about to start, or when the conversation
 * closes. An interrupt ends it `interrupted`, and reaching the turn time limit `timeout`;
 * both ask the runtime to stop its work (`stopRuntime`). At most one is open at a time.
 */
export class AutonomousTurn {
  private open: { turnId: string; started: number; idle: NodeJS.Timeout; limit: NodeJS.Timeout } | null = null;
  /** The quiet time that ends it; the latest `turn.start` may change it. */
  idleMs = AUTONOMOUS_IDLE_MS_DEFAULT;
  /** The longest it may last (the turn time limit); the latest `turn.start` sets it. */
  limitMs = AUTONOMOUS_LIMIT_MS_DEFAULT;

  constructor(
    private readonly conversationId: string,
    private readonly emit: (event: RunnerEvent) => void,
    /** Told when the turn starts and ends, as the runner reports its other turns. */
    private readonly report: (
      state: 'started' | 'done' | 'interrupted' | 'timeout',
      turnId: string,
      durationMs: number,
    ) => void,
    /** Asks the runtime to stop what it is doing (ACP `session/cancel`). */
    private readonly stopRuntime: () => void,
  ) {}

  /** The open autonomous turn, if any (output that does not open one still goes there). */
  get current(): string | null {
    return this.open?.turnId ?? null;
  }

  /** The autonomous turn for an update that arrived now: the open one, else a new one; its idle time starts again. */
  touch(): string {
    if (this.open) {
      this.open.idle.refresh();
      return this.open.turnId;
    }
    const turnId = newId('trn');
    const idle = setTimeout(() => this.end('idle'), this.idleMs);
    const limit = setTimeout(() => this.end('timeout'), this.limitMs);
    this.open = { turnId, started: Date.now(), idle, limit };
    this.emit({
      conversation_id: this.conversationId,
      turn_id: turnId,
      kind: 'stage',
      stream: 'stage',
      stage: 'turn',
      state: 'started',
      data: JSON.stringify(AUTONOMOUS_TURN_DATA),
    });
    this.report('started', turnId, 0);
    return turnId;
  }

  /**
   * Ends the open autonomous turn, saying why: `interrupted` and `timeout` are its state (and
   * stop the runtime's work), every other reason ends it `done`. Nothing when none is open.
   */
  end(why: Why): void {
    const open = this.open;
    if (!open) return;
    this.open = null;
    clearTimeout(open.idle);
    clearTimeout(open.limit);
    const state = why === 'interrupted' || why === 'timeout' ? why : 'done';
    const durationMs = Date.now() - open.started;
    this.emit({
      conversation_id: this.conversationId,
      turn_id: open.turnId,
      kind: 'stage',
      stream: 'stage',
      stage: 'turn',
      state,
      duration_ms: durationMs,
      data: JSON.stringify(state === 'done' ? { usage: null, stop_reason: why } : { usage: null }),
    });
    this.report(state, open.turnId, durationMs);
    if (state !== 'done') this.stopRuntime();
  }
}
