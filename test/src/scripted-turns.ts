/**
 * A test's side of the scripted agent's `run64` keyword (fixtures/scripted-acp-agent.ts): bash
 * command lines as an agent's Bash tool runs them, the turn they run in, and what each said.
 */
import type { Client } from './harness.ts';
import type { WireEvent } from './sse-client.ts';
import { until } from './until.ts';

/** What one `run64` command did: its exit code (null: killed) and its stdout and stderr. */
export interface Ran {
  code: number | null;
  out: string;
}

/** A prompt that has the scripted agent run each of `lines` with `bash -c`, in order. */
export function run64(lines: readonly string[]): string {
  return lines.map((line) => `run64 ${Buffer.from(line).toString('base64')}`).join(' ');
}

/** What each `run64` command of a reply did, in order. */
export function ranIn(reply: string): Ran[] {
  return [...reply.matchAll(/run64 (\d+) => ([A-Za-z0-9+/=]+)\./g)].map(
    (m) => JSON.parse(Buffer.from(m[2] as string, 'base64').toString('utf8')) as Ran,
  );
}

/** The state of the conversation's latest turn once it is no longer `running` (30 s at most). */
export function turnSettled(http: Client, token: string, conversationId: string, timeoutMs = 30_000): Promise<string> {
  return until(
    `a turn of ${conversationId} to end`,
    async () => {
      const turns = (await http.get(`/api/conversations/${conversationId}/turns`, { token })).body.data as {
        state: string;
      }[];
      // Oldest first: the latest is the last.
      const state = turns.at(-1)?.state;
      return state && state !== 'running' ? state : undefined;
    },
    timeoutMs,
  );
}

/** The conversation's events (their blocks parsed) and the runtime's reply text in them. */
export async function replyOf(
  http: Client,
  token: string,
  conversationId: string,
): Promise<{ events: WireEvent[]; reply: string }> {
  const events = (await http.get(`/api/conversations/${conversationId}/events?limit=1000&blocks=true`, { token })).body
    .data as WireEvent[];
  const reply = events
    .flatMap((e) => (e.stream === 'acp' ? (e.blocks ?? []) : []))
    .filter((b) => b.kind === 'text')
    .map((b) => b.body)
    .join('');
  return { events, reply };
}
