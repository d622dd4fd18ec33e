import {
  classifyRuntimeFailure,
  classifySpawnFailure,
  PROVIDER_ERROR_CODES,
  type RunnerEvent,
  type TurnError,
  type TurnStartCommand,
} from '@svc/core';
import { AutonomousTurn, isAgentWork } from './autonomous.ts';
import { writeHomeFiles } from './home-files.ts';
import { ConversationPermissions } from './permissions.ts';
import { AcpRuntime, RuntimeSpawnError } from './runtime.ts';
import { type Sandbox, sandboxEnv } from './sandbox.ts';

type Emit = (event: RunnerEvent) => void;

/** A turn starting or ending on this runner, for the operator's terminal. */
export type TurnReport =
  | { conversationId: string; turnId: string; state: 'started' }
  | {
      conversationId: string;
      turnId: string;
      state: 'done' | 'interrupted' | 'timeout' | 'failed';
      durationMs: number;
      /** Why it failed or was interrupted, when something says so. */
      error?: string;
    };

/** How long a closing conversation's turn has to answer its cancel before the runtime stops. */
const CLOSE_GRACE_MS = 3000;

interface Session {
  /** The sandbox the runtime runs on. */
  sandbox: string;
  runtime: AcpRuntime;
  permissions: ConversationPermissions;
  /** The turn running now, if any. */
  turnId: string | null;
  /** The turn that started last (a user's or an autonomous one): output that opens no turn goes there. */
  lastTurnId: string;
  /** Where the runtime's output goes while no turn runs. */
  autonomous: AutonomousTurn;
  /** Set when the turn was ended by its time limit (the cancel then reports `timeout`). */
  timedOut: boolean;
  /** Resolves when the running turn has reported its end. */
  ended: Promise<void>;
  /** Set when we stop the runtime on purpose: its turn ends `interrupted`, not `failed`. */
  closing?: string;
  /** The runtime's last stderr lines of the running turn: a failure's reason is often there. */
  stderr: string[];
}

/** How many of a turn's last stderr lines a failure is classified with. */
const STDERR_KEPT = 20;

/**
 * The conversations running on this runner: one ACP runtime per conversation, started on
 * its first turn in the sandbox's directory with the sandbox's environment, kept across
 * turns. Each turn is reported as stage `turn` (started, then done / interrupted / timeout /
 * failed with `{"usage": ...}`; failed adds `code` and `error`, and stage `model` failed
 * comes first when the provider was the cause), its updates as `acp` events and the
 * runtime's stderr as `stderr` events.
 *
 * Permission requests follow the turn's `permission_policy` (ConversationPermissions): one
 * the policy asks about waits for `answer()` (an answer over the API), its timeout, or the
 * end of its turn; the others are answered with the first allow option. Each is in the log.
 */
export class Turns {
  private readonly sessions = new Map<string, Session>();

  constructor(
    private readonly emitFor: (sandbox: string, incarnation: number) => Emit,
    /** Told when each turn starts and ends (after its `turn` stage event is emitted). */
    private readonly onTurn: (report: TurnReport) => void = () => {},
    /** Whose RUNTIME_<NAME>_COMMAND a missing agent command names (RuntimeIdentity.settings). */
    private readonly settings: 'runner' | 'service' = 'runner',
  ) {}

  /**
   * Which turn the conversation's output belongs to: the running turn, else, for an update of
   * the agent's work (`opens`), the autonomous turn (opened for it when none is open), else the
   * open autonomous turn, else the turn that started last; `fallback` (the first turn) while the
   * runtime is still starting.
   */
  private turnOf(conversationId: string, fallback: string | null, opens: boolean): string | null {
    const s = this.sessions.get(conversationId);
    if (!s) return fallback;
    if (s.turnId) return s.turnId;
    if (opens && !s.closing) return s.autonomous.touch();
    return s.autonomous.current ?? s.lastTurnId;
  }

  /** The turn `conversationId` is running now, if any. */
  runningTurn(conversationId: string): string | null {
    return this.sessions.get(conversationId)?.turnId ?? null;
  }

  async start(command: TurnStartCommand, sandbox: Promise<Sandbox>): Promise<void> {
    const emit = this.emitFor(command.sandbox, command.incarnation);
    const at = { conversation_id: command.conversation_id, turn_id: command.turn_id };
    const stage = (name: string, state: string, extra: Partial<RunnerEvent> = {}) =>
      emit({ ...at, kind: 'stage', stream: 'stage', stage: name, state, ...extra });
    let started = Date.now();
    const ids = { conversationId: command.conversation_id, turnId: command.turn_id };
    // A user's turn ends the autonomous one first: nothing of the two is interleaved.
    this.sessions.get(command.conversation_id)?.autonomous.end('prompt');
    const start = () => {
      stage('turn', 'started');
      this.onTurn({ ...ids, state: 'started' });
    };
    const end = (
      state: 'done' | 'interrupted' | 'timeout' | 'failed',
      data: { usage: unknown; code?: string; error?: string; stop_reason?: string },
    ) => {
      const durationMs = Date.now() - started;
      stage('turn', state, { duration_ms: durationMs, data: JSON.stringify(data) });
      this.onTurn({ ...ids, state, durationMs, ...(data.error ? { error: data.error } : {}) });
    };
    // A failed turn says why as `{code, error}`; a failure of the model provider says so first
    // as stage `model` failed (the stage of a runtime or provider refusing the model).
    const fail = (error: TurnError) => {
      if (PROVIDER_ERROR_CODES.has(error.code)) {
        stage('model', 'failed', { data: JSON.stringify({ code: error.code, error: error.message }) });
      }
      end('failed', { usage: null, code: error.code, error: error.message });
    };
    const who = { runtime: command.runtime.name, command: command.runtime.command, settings: this.settings };

    // The turn starts once its sandbox is built (the build's stages come first).
    let built: Sandbox;
    try {
      built = await sandbox;
    } catch (err) {
      start();
      return fail({ code: 'sandbox_failed', message: `The sandbox could not be built: ${(err as Error).message}` });
    }
    started = Date.now();
    start();
    let session = this.sessions.get(command.conversation_id);
    if (session?.turnId) {
      return end('failed', { usage: null, error: 'another turn of this conversation is still running' });
    }
    if (!session) {
      const sessionStarted = Date.now();
      stage('session', 'started');
      const stderr: string[] = [];
      const permissions = new ConversationPermissions((e) =>
        emit({
          ...e,
          conversation_id: command.conversation_id,
          turn_id: this.turnOf(command.conversation_id, command.turn_id, false),
        }),
      );
      try {
        await writeHomeFiles(built.dir, command.runtime.home_files ?? [], built.user, built.confine);
        const runtime = await AcpRuntime.start({
          command: command.runtime.command,
          args: command.runtime.args,
          cwd: built.dir,
          env: sandboxEnv({ ...built, env: command.runtime.env }, command.conversation_id, command.broker),
          ...(built.user ? { user: built.user } : {}),
          ...(built.confine ? { confine: built.confine } : {}),
          // The runtime's own command line (not the agent's settings after it) names files the
          // sandbox must see to run it: its executable, an interpreter's script.
          commandFiles: [
            command.runtime.command,
            ...command.runtime.args.slice(
              0,
              command.runtime.args.length - (command.runtime.settings_args ?? []).length,
            ),
          ],
          ...(command.runtime.model ? { model: command.runtime.model } : {}),
          ...(command.runtime.session_meta ? { sessionMeta: command.runtime.session_meta } : {}),
          mcpServers: [...(command.mcp_servers ?? []), ...(command.mcp_http_servers ?? [])],
          onUpdate: (update) =>
            emit({
              conversation_id: command.conversation_id,
              turn_id: this.turnOf(command.conversation_id, command.turn_id, isAgentWork(update)),
              kind: 'output',
              stream: 'acp',
              data: JSON.stringify(update),
            }),
          onStderr: (line) => {
            stderr.push(line);
            if (stderr.length > STDERR_KEPT) stderr.shift();
            emit({
              conversation_id: command.conversation_id,
              turn_id: this.turnOf(command.conversation_id, command.turn_id, false),
              kind: 'output',
              stream: 'stderr',
              data: `${line}\n`,
            });
          },
          onPermission: (request) => permissions.ask(request),
        });
        session = {
          sandbox: command.sandbox,
          runtime,
          permissions,
          turnId: null,
          lastTurnId: command.turn_id,
          autonomous: new AutonomousTurn(
            command.conversation_id,
            emit,
            (state, turnId, durationMs) => {
              if (state === 'started' && session) session.lastTurnId = turnId;
              this.onTurn(
                state === 'started'
                  ? { conversationId: command.conversation_id, turnId, state }
                  : { conversationId: command.conversation_id, turnId, state, durationMs },
              );
            },
            () => void runtime.cancel().catch(() => {}),
          ),
          timedOut: false,
          stderr,
          ended: Promise.resolve(),
        };
        this.sessions.set(command.conversation_id, session);
        stage('session', 'done', { duration_ms: Date.now() - sessionStarted });
      } catch (err) {
        stage('session', 'failed', { duration_ms: Date.now() - sessionStarted, data: (err as Error).message });
        return fail(
          err instanceof RuntimeSpawnError
            ? classifySpawnFailure(err.errno, err.message, who)
            : classifyRuntimeFailure((err as Error).message, who, stderr),
        );
      }
    }
    const s = session;
    s.turnId = command.turn_id;
    s.lastTurnId = command.turn_id;
    s.stderr.length = 0;
    s.timedOut = false;
    let turnEnded = () => {};
    s.ended = new Promise<void>((resolve) => {
      turnEnded = resolve;
    });
    s.permissions.configure(command.permission_policy, command.permission_timeout_ms);
    if (command.autonomous_idle_ms) s.autonomous.idleMs = command.autonomous_idle_ms;
    s.autonomous.limitMs = command.time_limit_ms;
    const limit = setTimeout(() => {
      s.timedOut = true;
      cancel(s);
    }, command.time_limit_ms);
    try {
      const images = (command.images ?? []).map((i) => ({ mimeType: i.media_type, data: i.data }));
      const result = await s.runtime.prompt(command.prompt, images);
      // A request the agent withdrew, or left open, is resolved before the turn's end.
      s.permissions.denyAll('turn_end');
      const state = result.stopReason === 'cancelled' ? (s.timedOut ? 'timeout' : 'interrupted') : 'done';
      end(state, { usage: result.usage, stop_reason: result.stopReason });
    } catch (err) {
      // The runtime is gone (it crashed, or we stopped it): the next turn starts a fresh one.
      if (this.sessions.get(command.conversation_id) === s) this.sessions.delete(command.conversation_id);
      await s.runtime.close().catch(() => {});
      s.permissions.denyAll('turn_end');
      if (s.closing) end('interrupted', { usage: null, error: s.closing });
      else fail(classifyRuntimeFailure((err as Error).message, who, s.stderr));
    } finally {
      clearTimeout(limit);
      s.turnId = null;
      turnEnded();
    }
  }

  /**
   * Interrupts the conversation's running turn (it ends `interrupted`); the sandbox stays. An
   * autonomous turn ends `interrupted` at once, and the runtime is asked to stop its work
   * (`session/cancel`); what it says after that opens a new autonomous turn.
   */
  interrupt(conversationId: string, turnId: string): void {
    const s = this.sessions.get(conversationId);
    if (s?.turnId === turnId) cancel(s);
    else if (s && s.autonomous.current === turnId) s.autonomous.end('interrupted');
  }

  /**
   * An answer over the API to a permission request of the conversation. False when no such
   * request waits here (already resolved, or its turn ended): the answer is then dropped.
   */
  answer(conversationId: string, requestId: string, optionId: string): boolean {
    return this.sessions.get(conversationId)?.permissions.answer(requestId, optionId) ?? false;
  }

  /**
   * The conversation ended: its running turn is cancelled (it ends `interrupted`) and its
   * runtime stops. A later turn of the same conversation would start a fresh runtime.
   */
  async close(conversationId: string): Promise<void> {
    const s = this.sessions.get(conversationId);
    if (!s) return;
    this.sessions.delete(conversationId);
    s.autonomous.end('closed');
    if (s.turnId) {
      // The turn ends `interrupted` as the runtime answers the cancel; one that does not
      // answer in time is stopped with its runtime.
      s.permissions.denyAll('interrupted');
      await s.runtime.cancel().catch(() => {});
      await Promise.race([s.ended, new Promise((resolve) => setTimeout(resolve, CLOSE_GRACE_MS))]);
    }
    s.closing = 'the conversation ended';
    await s.runtime.close().catch(() => {});
  }

  /** Closes the runtimes of every conversation on the sandbox (its machine goes or is built again). */
  async closeSandbox(sandbox: string): Promise<void> {
    const on = [...this.sessions].filter(([, s]) => s.sandbox === sandbox).map(([id]) => id);
    await Promise.all(on.map((id) => this.close(id)));
  }

  /** Stops every runtime (the runner is stopping). */
  async closeAll(): Promise<void> {
    const all = [...this.sessions.values()];
    this.sessions.clear();
    for (const s of all) {
      s.closing = 'the runner stopped';
      s.autonomous.end('closed');
    }
    await Promise.all(all.map((s) => s.runtime.close().catch(() => {})));
  }
}

/**
 * Cancels the running turn (`session/cancel`; the runtime answers open requests `cancelled`),
 * then reports those requests resolved by the interrupt.
 */
function cancel(s: Session): void {
  void s.runtime.cancel();
  s.permissions.denyAll('interrupted');
}
