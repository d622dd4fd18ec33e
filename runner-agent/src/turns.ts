import type { RunnerEvent, TurnStartCommand } from '@svc/core';
import { AcpRuntime, type PermissionAnswer } from './runtime.ts';
import { type Sandbox, sandboxEnv } from './sandbox.ts';

type Emit = (event: RunnerEvent) => void;

interface Session {
  /** The sandbox the runtime runs in. */
  sandbox: string;
  runtime: AcpRuntime;
  /** The turn running now, if any. */
  turnId: string | null;
  /** Set when the turn was ended by its time limit (the cancel then reports `timeout`). */
  timedOut: boolean;
}

/**
 * The conversations running on this runner: one ACP runtime per conversation, started on
 * its first turn in the sandbox's directory with the sandbox's environment, kept across
 * turns. Each turn is reported as stage `turn` (started, then done / interrupted / timeout /
 * failed with `{"usage": ...}`), its updates as `acp` events and the runtime's stderr as
 * `stderr` events.
 *
 * Permission requests are answered by the first `allow` option the runtime offers (the
 * owner's policy and answers over the API come with the permission work); each request is
 * in the log as its `acp` event.
 */
export class Turns {
  private readonly sessions = new Map<string, Session>();

  constructor(private readonly emitFor: (sandbox: string, incarnation: number) => Emit) {}

  async start(command: TurnStartCommand, sandbox: Promise<Sandbox>): Promise<void> {
    const emit = this.emitFor(command.sandbox, command.incarnation);
    const at = { conversation_id: command.conversation_id, turn_id: command.turn_id };
    const stage = (name: string, state: string, extra: Partial<RunnerEvent> = {}) =>
      emit({ ...at, kind: 'stage', stream: 'stage', stage: name, state, ...extra });
    let started = Date.now();
    const end = (state: 'done' | 'interrupted' | 'timeout' | 'failed', data: object) =>
      stage('turn', state, { duration_ms: Date.now() - started, data: JSON.stringify(data) });

    // The turn starts once its sandbox is built (the build's stages come first).
    let built: Sandbox;
    try {
      built = await sandbox;
    } catch (err) {
      stage('turn', 'started');
      return end('failed', { usage: null, error: `the sandbox could not be built: ${(err as Error).message}` });
    }
    started = Date.now();
    stage('turn', 'started');
    let session = this.sessions.get(command.conversation_id);
    if (session?.turnId) {
      return end('failed', { usage: null, error: 'another turn of this conversation is still running' });
    }
    if (!session) {
      const sessionStarted = Date.now();
      stage('session', 'started');
      const current: { turnId: string | null } = { turnId: command.turn_id };
      try {
        const runtime = await AcpRuntime.start({
          command: command.runtime.command,
          args: command.runtime.args,
          cwd: built.dir,
          env: sandboxEnv({ dir: built.dir, env: command.runtime.env }),
          onUpdate: (update) =>
            emit({
              conversation_id: command.conversation_id,
              turn_id: this.sessions.get(command.conversation_id)?.turnId ?? current.turnId,
              kind: 'output',
              stream: 'acp',
              data: JSON.stringify(update),
            }),
          onStderr: (line) =>
            emit({
              conversation_id: command.conversation_id,
              turn_id: this.sessions.get(command.conversation_id)?.turnId ?? current.turnId,
              kind: 'output',
              stream: 'stderr',
              data: `${line}\n`,
            }),
          onPermission: async (request) => firstAllow(request),
        });
        session = { sandbox: command.sandbox, runtime, turnId: null, timedOut: false };
        this.sessions.set(command.conversation_id, session);
        stage('session', 'done', { duration_ms: Date.now() - sessionStarted });
      } catch (err) {
        stage('session', 'failed', { duration_ms: Date.now() - sessionStarted, data: (err as Error).message });
        return end('failed', { usage: null, error: (err as Error).message });
      }
    }
    const s = session;
    s.turnId = command.turn_id;
    s.timedOut = false;
    const limit = setTimeout(() => {
      s.timedOut = true;
      void s.runtime.cancel();
    }, command.time_limit_ms);
    try {
      const result = await s.runtime.prompt(command.prompt);
      const state = result.stopReason === 'cancelled' ? (s.timedOut ? 'timeout' : 'interrupted') : 'done';
      end(state, { usage: result.usage, stop_reason: result.stopReason });
    } catch (err) {
      // The runtime is gone (it crashed): the next turn starts a fresh one.
      this.sessions.delete(command.conversation_id);
      await s.runtime.close().catch(() => {});
      end('failed', { usage: null, error: (err as Error).message });
    } finally {
      clearTimeout(limit);
      s.turnId = null;
    }
  }

  /** Interrupts the conversation's running turn (it ends `interrupted`); the sandbox stays. */
  interrupt(conversationId: string, turnId: string): void {
    const s = this.sessions.get(conversationId);
    if (s?.turnId === turnId) void s.runtime.cancel();
  }

  /** Stops the runtimes running in a sandbox (its machine is being destroyed). */
  async closeSandbox(sandbox: string): Promise<void> {
    const going = [...this.sessions].filter(([, s]) => s.sandbox === sandbox);
    for (const [conversationId] of going) this.sessions.delete(conversationId);
    await Promise.all(going.map(([, s]) => s.runtime.close().catch(() => {})));
  }

  /** Stops every runtime (the runner is stopping). */
  async closeAll(): Promise<void> {
    const all = [...this.sessions.values()];
    this.sessions.clear();
    await Promise.all(all.map((s) => s.runtime.close().catch(() => {})));
  }
}

/** The first option of kind allow_once / allow_always, else cancelled. */
function firstAllow(request: unknown): PermissionAnswer {
  const options = (request as { options?: { optionId: string; kind: string }[] }).options ?? [];
  const allow = options.find((o) => o.kind === 'allow_once' || o.kind === 'allow_always');
  return allow ? { outcome: 'selected', optionId: allow.optionId } : { outcome: 'cancelled' };
}
