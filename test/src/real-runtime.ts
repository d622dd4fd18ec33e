// What the end-to-end tests of a real runtime adapter share: a real svc-runner process, a
// conversation launched over HTTP and watched over SSE until its turn ends.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';
import { signUp, startTestService, type TestService } from './harness.ts';
import { frames, parseFrame, rawGet, type WireEvent } from './sse-client.ts';

const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A deadline that does not keep the process alive once the test is done. */
const deadline = (ms: number) => new Promise((r) => setTimeout(r, ms).unref());

/**
 * The service with the runtime command and provider endpoint `env` names, quick runner
 * heartbeats, and streams that stay open through a slow runtime start.
 */
export function serviceForRuntime(t: Test, env: Record<string, string>) {
  return startTestService(t, {
    env: { RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '5000', SSE_IDLE_CLOSE_MS: '30000', ...env },
  });
}

/**
 * A new account with its inference credential stored (validated against the fake), an
 * environment and an agent on provider `runner`: where every real-runtime test starts. With
 * `validated`, the requests the fake saw during validation (`seen`) must be exactly those.
 */
export async function accountWithAgent(
  t: Test,
  svc: TestService,
  o: {
    credential: string;
    key: string;
    /** False stores the credential unchecked (a key the provider will refuse). */
    validate?: boolean;
    validated?: { seen: () => string[]; expected: string[] };
    environment: Record<string, unknown>;
    agent: Record<string, unknown>;
  },
): Promise<{ token: string; agent: { id: string } }> {
  const { http } = svc;
  const { key: token } = await signUp(svc);
  const put = await http.put(`/api/account/inference-credentials/${o.credential}`, {
    token,
    body: { value: o.key, validate: o.validate ?? true },
  });
  t.equal(put.status, 200, JSON.stringify(put.body));
  if (o.validated) t.same(o.validated.seen(), o.validated.expected, 'the credential was validated against the fake');
  const env = (await http.post('/api/environments', { token, body: o.environment })).body;
  const agent = (
    await http.post('/api/agents', {
      token,
      body: { ...o.agent, environment_id: env.id, sandbox_provider: 'runner' },
    })
  ).body;
  t.ok(agent.id, JSON.stringify(agent));
  return { token, agent };
}

/**
 * A real `svc-runner` connected with a new runner token of the account, its sandboxes under a
 * fresh root, with `args` added to its command line. At teardown it gets SIGTERM, which ends its runtimes (process groups of their
 * own that SIGKILL would leave behind) before it exits, then `closeAfter` runs and the root
 * is removed (or left, named in a comment, when a runtime still writes into it).
 */
export async function startRunnerAgent(
  t: Test,
  svc: Pick<TestService, 'url' | 'http'>,
  token: string,
  closeAfter: () => Promise<void>,
  args: string[] = [],
) {
  const runner = (await svc.http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const root = mkdtempSync(join(tmpdir(), 'svc-runtime-root-'));
  const child = spawn(process.execPath, [BIN, '--url', svc.url, '--token', runner.token, '--root', root, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d) => {
    out += d;
  });
  child.stderr.on('data', (d) => {
    out += d;
  });
  t.teardown(async () => {
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    await Promise.race([exited, deadline(5000)]);
    await closeAfter();
    // A runtime's last writes (its session files, on SIGTERM) may race the removal; a root
    // left in the temporary directory must not fail the test or keep the other teardowns
    // from running.
    try {
      rmSync(root, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
    } catch (err) {
      t.comment(`left ${root}: ${(err as Error).message}`);
    }
  });
  for (let i = 0; i < 600 && !/connected as runner/.test(out); i++) await sleep(50);
  if (!/connected as runner/.test(out)) throw new Error(`svc-runner did not connect: ${out}`);
  return { root, output: () => out };
}

/**
 * Launches a conversation of `agentId` with `prompt` over HTTP and reads its stream (with
 * blocks) until the server ends it after the turn, or 60 s pass. Resolves with the events and
 * whether the stream ended by itself.
 */
export async function launchAndWatch(svc: TestService, token: string, agentId: string, prompt: string) {
  const res = await svc.http.post('/api/conversations', { token, body: { agent_id: agentId, prompt } });
  if (res.status !== 201) throw new Error(`launch: ${res.status} ${JSON.stringify(res.body)}`);
  const id = res.body.id as string;
  const watch = rawGet(svc, `/api/conversations/${id}/stream?blocks=true&last_event_id=0`, {
    authorization: `Bearer ${token}`,
  });
  const ended = await Promise.race([watch.closed.then(() => true), deadline(60_000).then(() => false)]);
  const events = frames(watch.text())
    .map(parseFrame)
    .filter((e) => e.data !== undefined)
    .map((e) => JSON.parse(e.data as string) as WireEvent);
  return { id, sandboxId: res.body.sandbox_id as string, ended, events };
}

/** The text of the blocks of `kind` in `events`, joined (a reply rebuilt from its chunks). */
export const blockText = (events: WireEvent[], kind: string) =>
  events
    .flatMap((e) => e.blocks ?? [])
    .filter((b) => b.kind === kind)
    .map((b) => b.body)
    .join('');

/** The turn's record once it has left `running` (the log may end a moment before it). */
export async function settledTurn(svc: Pick<TestService, 'http'>, token: string, conversationId: string) {
  let turns: {
    state: string;
    usage: { input: number; output: number } | null;
    error: { code: string; message: string } | null;
    reply: string | null;
    ended_at: string | null;
  }[] = [];
  for (let i = 0; i < 100; i++) {
    turns = (await svc.http.get(`/api/conversations/${conversationId}/turns`, { token })).body.data;
    if (turns[0]?.state !== 'running') break;
    await sleep(50);
  }
  return turns[0];
}

/**
 * Checks what a user watching a first turn that answers without tools sees: the stream ends
 * by itself, every stage comes in order (the sandbox built with nothing to clone or install,
 * the runtime's session opened, the turn done with `end_turn`), the reply and the thinking are
 * rebuilt from their chunks, and the turn's record is done.
 */
export async function checkPlainTurn(
  t: Test,
  svc: Pick<TestService, 'http'>,
  token: string,
  run: Awaited<ReturnType<typeof launchAndWatch>>,
  expected: { reply: string; thinking: string; log: () => string },
) {
  const { events } = run;
  const log = () => `${expected.log()}\nlast events: ${JSON.stringify(events.slice(-4))}`;
  t.ok(run.ended, 'the stream ended by itself at the end of the turn');
  const stages = events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
  // An isolated sandbox always has its `network` stage (its bridges out of its namespace), and
  // with the broker on (the default there) its `broker` stage.
  const network = ['network started', 'network done', 'broker started', 'broker done'];
  t.same(
    stages,
    [
      'sandbox started',
      'provision started',
      'provision done',
      ...network,
      'sandbox done',
      'turn started',
      'session started',
      'session done',
      'turn done',
    ],
    'every stage, in order',
  );
  const turnEnd = events.find((e) => e.stage === 'turn' && e.state === 'done');
  t.match(JSON.parse(turnEnd?.data ?? '{}'), { stop_reason: 'end_turn' }, log());
  t.equal(blockText(events, 'text'), expected.reply, 'the reply, rebuilt from its streamed chunks');
  t.match(blockText(events, 'thinking'), expected.thinking, 'the thinking');
  const turn = await settledTurn(svc, token, run.id);
  t.equal(turn?.state, 'done', log());
  return turn;
}
