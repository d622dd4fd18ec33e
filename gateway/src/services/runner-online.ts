/** Presence: a runner is online while connected and heard from within `offlineAfterMs`. */
export function runnerOnline(connected: boolean, lastSeenAt: Date | null, offlineAfterMs: number, now = Date.now()) {
  return connected && lastSeenAt !== null && now - lastSeenAt.getTime() < offlineAfterMs;
}
