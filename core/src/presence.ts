/**
 * A teammate's presence: one state and a short sentence for people, from signals the service
 * gathers about its live conversation, that conversation's sandbox and the runner it lives on.
 * Pure, so the rule reads (and is tested) as a table.
 */

export const PRESENCE_STATES = [
  'working',
  'starting',
  'online',
  'asleep',
  'away',
  'machine_offline',
  'failed',
  'offline',
] as const;
export type PresenceState = (typeof PRESENCE_STATES)[number];

export interface PresenceSignals {
  /**
   * The status of the live conversation's sandbox; null when there is no machine: no live
   * conversation, no sandbox, or a sandbox a reset left without one.
   */
  sandbox: 'provisioning' | 'ready' | 'suspended' | 'terminated' | 'failed' | null;
  /** The sandbox lives on the tenant's own runner (provider `runner`). */
  runnerBacked: boolean;
  /** That runner is connected and heard from recently (the runners' presence). */
  runnerOnline: boolean;
  /** When that runner was last heard from; null when never. */
  runnerLastSeenAt: Date | null;
  /** A turn runs on the live conversation. */
  turnRunning: boolean;
  /** The live conversation can take a message (it exists and is not terminated). */
  resumable: boolean;
}

export interface TeammatePresence {
  state: PresenceState;
  label: string;
}

const live = (s: PresenceSignals['sandbox']) => s === 'provisioning' || s === 'ready' || s === 'suspended';

/** `HH:MM` in UTC, as labels show a time. */
function clock(d: Date): string {
  return d.toISOString().slice(11, 16);
}

/**
 * The first state whose condition holds, in this order: `failed` (its sandbox failed),
 * `machine_offline` (runner-backed, live, and that runner is not online), `starting` (the
 * machine is being built or woken), `working` (a turn runs), `asleep` (suspended), `online`
 * (ready), `away` (the live conversation cannot be resumed: the next message opens a fresh
 * one), `offline` (no machine: the next message builds one).
 */
export function presenceOf(s: PresenceSignals): TeammatePresence {
  if (s.sandbox === 'failed') return { state: 'failed', label: 'Its machine failed to start' };
  if (s.runnerBacked && live(s.sandbox) && !s.runnerOnline) {
    return {
      state: 'machine_offline',
      label: s.runnerLastSeenAt ? `Machine offline since ${clock(s.runnerLastSeenAt)}` : 'Machine offline',
    };
  }
  if (s.sandbox === 'provisioning') return { state: 'starting', label: 'Starting its machine' };
  if (s.turnRunning) return { state: 'working', label: 'Working on a turn' };
  if (s.sandbox === 'suspended') return { state: 'asleep', label: 'Asleep; a message wakes it' };
  if (s.sandbox === 'ready') return { state: 'online', label: 'Online' };
  if (!s.resumable) return { state: 'away', label: 'Away; the next message opens a fresh conversation' };
  return { state: 'offline', label: 'Offline; the next message starts its machine' };
}
