import { randomBytes } from 'node:crypto';
import {
  PERMISSION_REQUEST_STAGE,
  type PermissionOption,
  type PermissionRequestDone,
  type PermissionRequestStarted,
  type PermissionResolution,
  type RunnerEvent,
  type TurnStartCommand,
} from '@svc/core';
import type { PermissionAnswer } from './runtime.ts';

export type PermissionPolicy = NonNullable<TurnStartCommand['permission_policy']>;

/** What a conversation's permission requests are reported with (its turn's id is added). */
export type EmitTurnEvent = (event: Omit<RunnerEvent, 'conversation_id' | 'turn_id'>) => void;

const DEFAULT_TIMEOUT_MS = 300_000;
const MAX_OPTIONS = 32;

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const text = (v: unknown, max: number) => (typeof v === 'string' ? v.slice(0, max) : '');

/** The options a `session/request_permission` offers, in order, as the log and the service see them. */
export function offeredOptions(request: unknown): PermissionOption[] {
  const options = isObject(request) && Array.isArray(request.options) ? request.options : [];
  return options
    .filter(isObject)
    .filter((o) => typeof o.optionId === 'string' && o.optionId.length > 0 && o.optionId.length <= 200)
    .slice(0, MAX_OPTIONS)
    .map((o) => ({ optionId: o.optionId as string, name: text(o.name, 500), kind: text(o.kind, 32) }));
}

/**
 * Whether the policy makes this request wait for an answer: every request under default
 * `ask`; under `auto_allow` those whose tool kind (`edit`, `execute`, ...) or exact tool name
 * (Claude Code's `_meta.claudeCode.toolName`, else the title the runtime gives the call) is
 * listed in `ask`. No policy: none waits.
 */
export function policyAsks(policy: PermissionPolicy | undefined, request: unknown): boolean {
  if (!policy) return false;
  if (policy.default === 'ask') return true;
  const tool = isObject(request) && isObject(request.toolCall) ? request.toolCall : {};
  const meta = isObject(tool._meta) && isObject(tool._meta.claudeCode) ? tool._meta.claudeCode : {};
  const names = [tool.kind, meta.toolName, tool.title].filter((n): n is string => typeof n === 'string');
  return names.some((n) => policy.ask.includes(n));
}

/** The first allow option, else `cancelled`. */
export function allowAnswer(options: PermissionOption[]): PermissionAnswer {
  const allow = options.find((o) => o.kind === 'allow_once' || o.kind === 'allow_always');
  return allow ? { outcome: 'selected', optionId: allow.optionId } : { outcome: 'cancelled' };
}

/** The first reject option (reject_once before reject_always), else `cancelled`. */
export function denyAnswer(options: PermissionOption[]): PermissionAnswer {
  const reject = options.find((o) => o.kind === 'reject_once') ?? options.find((o) => o.kind === 'reject_always');
  return reject ? { outcome: 'selected', optionId: reject.optionId } : { outcome: 'cancelled' };
}

interface OpenRequest {
  options: PermissionOption[];
  openedAt: number;
  timer: NodeJS.Timeout;
  resolve(answer: PermissionAnswer): void;
}

/**
 * The permission requests of one conversation's runtime. Each request gets an id and its
 * `acp` event; the policy of the running turn decides whether it waits. One that waits is
 * resolved exactly once: by an answer over the API (`answer`), by the timeout, or when its
 * turn ends or is interrupted (`denyAll`), each time with a `request` `done` event saying how.
 */
export class ConversationPermissions {
  private readonly open = new Map<string, OpenRequest>();
  private policy: PermissionPolicy | undefined;
  private timeoutMs = DEFAULT_TIMEOUT_MS;

  constructor(private readonly emit: EmitTurnEvent) {}

  /** The policy and timeout of the turn that starts now (from its `turn.start`). */
  configure(policy: PermissionPolicy | undefined, timeoutMs: number | undefined): void {
    this.policy = policy;
    this.timeoutMs = timeoutMs ?? DEFAULT_TIMEOUT_MS;
  }

  /** The runtime's `onPermission`: resolves with what goes back to the agent. Never rejects. */
  ask(request: unknown): Promise<PermissionAnswer> {
    const requestId = `prq_${randomBytes(12).toString('hex')}`;
    const options = offeredOptions(request);
    const logged = JSON.stringify({ ...(isObject(request) ? request : {}), requestId });
    if (!policyAsks(this.policy, request)) {
      const answer = allowAnswer(options);
      this.emit({ kind: 'output', stream: 'acp', data: logged });
      this.done({ request_id: requestId, resolution: 'policy', option_id: optionOf(answer) }, 0);
      return Promise.resolve(answer);
    }
    const started: PermissionRequestStarted = { request_id: requestId, options };
    // Started first: the service records the request before its block can reach a client.
    this.emit({
      kind: 'stage',
      stream: 'stage',
      stage: PERMISSION_REQUEST_STAGE,
      state: 'started',
      data: JSON.stringify(started),
    });
    this.emit({ kind: 'output', stream: 'acp', data: logged });
    return new Promise<PermissionAnswer>((resolve) => {
      const timer = setTimeout(() => this.settle(requestId, 'timeout', denyAnswer(options)), this.timeoutMs);
      timer.unref();
      this.open.set(requestId, { options, openedAt: Date.now(), timer, resolve });
    });
  }

  /**
   * An answer over the API. False (and nothing changes) when the request is not open here any
   * more or the option was not offered.
   */
  answer(requestId: string, optionId: string): boolean {
    const r = this.open.get(requestId);
    if (!r?.options.some((o) => o.optionId === optionId)) return false;
    this.settle(requestId, 'answered', { outcome: 'selected', optionId });
    return true;
  }

  /**
   * Resolves every open request: at the end of its turn it is denied (first reject option);
   * on an interrupt it is `cancelled`, as ACP asks of a client that cancels.
   */
  denyAll(resolution: 'turn_end' | 'interrupted'): void {
    for (const [id, r] of [...this.open]) {
      this.settle(id, resolution, resolution === 'interrupted' ? { outcome: 'cancelled' } : denyAnswer(r.options));
    }
  }

  /** How many requests wait for an answer. */
  get waiting(): number {
    return this.open.size;
  }

  private settle(requestId: string, resolution: PermissionResolution, answer: PermissionAnswer): void {
    const r = this.open.get(requestId);
    if (!r) return;
    this.open.delete(requestId);
    clearTimeout(r.timer);
    this.done({ request_id: requestId, resolution, option_id: optionOf(answer) }, Date.now() - r.openedAt);
    r.resolve(answer);
  }

  private done(data: PermissionRequestDone, durationMs: number): void {
    this.emit({
      kind: 'stage',
      stream: 'stage',
      stage: PERMISSION_REQUEST_STAGE,
      state: 'done',
      duration_ms: durationMs,
      data: JSON.stringify(data),
    });
  }
}

const optionOf = (a: PermissionAnswer) => (a.outcome === 'selected' ? a.optionId : null);
