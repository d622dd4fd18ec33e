import { AUTONOMOUS_TURN_DATA, newId, type RunnerEvent } from '@svc/core';

/** How long a runtime stays quiet before its autonomous turn ends, when the service names none. */
export const AUTONOMOUS_IDLE_MS_DEFAULT = 3000;

/**
 * The autonomous turn of one conversation: what its runtime says while none of its turns runs
 * (an agent that keeps working after its answer) goes into a turn the runner opens for it, so
 * nothing it says lands outside a turn. The turn opens (stage `turn` started, data
 * `AUTONOMOUS_TURN_DATA`, an id the runner chose) at the first such update, and ends `done`
 * (`{"usage": null, "stop_reason": "idle" | "prompt" | "closed"}`) once the runtime has been
 * quiet for the idle time, when a user's turn is about to start, or when the conversation
 * closes; an interrupt ends it `interrupted`. At most one is open at a time.
 */
export class AutonomousTurn {
  private open: { turnId: string; started: number; timer: NodeJS.Timeout } | null = null;

  constructor(
    private readonly conversationId: string,
    private readonly emit: (event: RunnerEvent) => void,
    /** Told when the turn starts and ends, as the runner reports its other turns. */
    private readonly report: (state: 'started' | 'done' | 'interrupted', turnId: string, durationMs: number) => void,
    /** The quiet time that ends it; the latest `turn.start` may change it. */
    public idleMs: number = AUTONOMOUS_IDLE_MS_DEFAULT,
  ) {}

  /** The open autonomous turn, if any (output that does not open one still goes there). */
  get current(): string | null {
    return this.open?.turnId ?? null;
  }

  /** The autonomous turn for an update that arrived now: the open one, else a new one; its idle time starts again. */
  touch(): string {
    if (this.open) {
      this.open.timer.refresh();
      return this.open.turnId;
    }
    const turnId = newId('trn');
    const timer = setTimeout(() => this.end('idle'), this.idleMs);
    this.open = { turnId, started: Date.now(), timer };
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

  /** Ends the open autonomous turn `done` (`interrupted` for an interrupt), saying why; nothing when none is open. */
  end(why: 'idle' | 'prompt' | 'closed' | 'interrupted'): void {
    const open = this.open;
    if (!open) return;
    this.open = null;
    clearTimeout(open.timer);
    const durationMs = Date.now() - open.started;
    this.emit({
      conversation_id: this.conversationId,
      turn_id: open.turnId,
      kind: 'stage',
      stream: 'stage',
      stage: 'turn',
      state: why === 'interrupted' ? 'interrupted' : 'done',
      duration_ms: durationMs,
      data: JSON.stringify({ usage: null, stop_reason: why }),
    });
    this.report(why === 'interrupted' ? 'interrupted' : 'done', open.turnId, durationMs);
  }
}
