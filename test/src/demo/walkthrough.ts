/**
 * The API calls a newcomer would make to see an agent answer, made against a running service
 * and printed as they go: each request as a `> METHOD path body` line and its short result as
 * `< status ...`, the way `curl -v` marks them. The conversation's SSE stream is followed until
 * its first turn ends, the agent's text printed as it arrives.
 */
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { EventSource } from 'eventsource';
import { CLAUDE_CODE_OFFLINE } from '../fakes/anthropic-messages.ts';
import { DEMO_KEY, DEMO_MODEL } from './stand-in.ts';

export const DEMO_PROMPT = 'Hello! What are you, and where do you run?';
const PASSWORD = 'a long demo password';

/** A response the walkthrough did not expect; the demo stops with it. */
export class StepFailed extends Error {}

interface Turn {
  id: string;
  state: string;
  usage: { input: number; output: number } | null;
  error: { code: string; message: string } | null;
}

/** A stream event with `blocks=true`, as far as the walkthrough prints it. */
interface StreamEvent {
  kind: string;
  stage: string | null;
  state: string | null;
  data: string | null;
  blocks?: { kind: string; id?: string; body?: string; summary?: string; name?: string }[];
}

const TURN_ENDS = new Set(['done', 'failed', 'interrupted', 'timeout']);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A tool result without the Markdown code fences the runtime puts around it, on one line. */
const unfenced = (text: string) =>
  text
    .split('\n')
    .filter((l) => !l.startsWith('```'))
    .join(' ')
    .trim();
const short = (text: string, max = 100) => (text.length > max ? `${text.slice(0, max - 3)}...` : text);

/**
 * The demo's output, kept in whole lines: a line printed while the agent's text is streaming
 * (a stand-in call, a stage) starts on a line of its own.
 */
export class Lines {
  private midLine = false;
  constructor(private readonly write: (text: string) => void) {}

  line(text: string): void {
    this.write(`${this.midLine ? '\n' : ''}${text}\n`);
    this.midLine = false;
  }

  /** Text as it streams in, after `label` when it starts a line. */
  stream(label: string, text: string): void {
    this.write(this.midLine ? text : `${label}${text}`);
    this.midLine = true;
  }
}

export interface Walkthrough {
  key: string;
  conversationId: string;
  turn: Turn;
}

/**
 * Registers an account, verifies it from the mail file, takes a key, stores the stand-in's
 * key as the inference credential (the service checks it against the stand-in), makes an
 * environment and a `claude` agent, starts a conversation and follows its stream to the end
 * of the first turn.
 * Throws StepFailed when the service answers a step with an unexpected status.
 */
export async function walkthrough(o: { base: string; mailDir: string; out: Lines }): Promise<Walkthrough> {
  const { base, out } = o;
  let key: string | undefined;

  async function call(method: string, path: string, body: unknown, expected: number) {
    out.line(`> ${method} ${path}${body === undefined ? '' : ` ${JSON.stringify(body)}`}`);
    const res = await fetch(`${base}${path}`, {
      method,
      headers: {
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        ...(key ? { authorization: `Bearer ${key}` } : {}),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status !== expected) throw new StepFailed(`${method} ${path} answered ${res.status}: ${short(text, 300)}`);
    return text ? JSON.parse(text) : {};
  }
  const result = (status: number, text: string) => out.line(`< ${status} ${text}`);

  const email = `newcomer-${Date.now().toString(36)}@example.com`;
  out.line('\nAn account:');
  const account = await call('POST', '/api/auth/register', { email, password: PASSWORD }, 201);
  result(201, `account ${account.id ?? email}; a verification mail went to the mail folder`);
  const mail = await mailTo(o.mailDir, email);
  out.line(`$ cat ${mail.file}`);
  const token = /token=([A-Za-z0-9_-]+)/.exec(mail.text)?.[1];
  if (!token) throw new StepFailed(`the verification mail carries no token: ${short(mail.text, 300)}`);
  out.line(`  "${mail.subject}": the link carries token=${token}`);
  await call('POST', '/api/auth/verify', { token }, 200);
  result(200, 'verified');
  const issued = await call('POST', '/api/auth/token', { email, password: PASSWORD }, 201);
  key = issued.key as string;
  result(201, `{"key":"${key}"} (the calls below send "authorization: Bearer <key>")`);

  out.line('\nAn agent (the inference credential is a demo key only the stand-in accepts):');
  await call('PUT', '/api/account/inference-credentials/anthropic_api_key', { value: DEMO_KEY, validate: true }, 200);
  result(200, 'stored, after the stand-in accepted it (GET /v1/models)');
  // The instance's ANTHROPIC_BASE_URL already sends the runtime to the stand-in; the
  // environment only keeps Claude Code from calling anything else.
  const environment = await call('POST', '/api/environments', { name: 'demo', env_vars: CLAUDE_CODE_OFFLINE }, 201);
  result(201, `environment ${environment.id} (its env_vars keep Claude Code off the internet)`);
  const agent = await call(
    'POST',
    '/api/agents',
    { name: 'demo agent', runtime: 'claude', model: `anthropic/${DEMO_MODEL}`, environment_id: environment.id },
    201,
  );
  result(201, `agent ${agent.id}, runtime claude (Claude Code through claude-agent-acp)`);

  out.line('\nA conversation:');
  const conversation = await call('POST', '/api/conversations', { agent_id: agent.id, prompt: DEMO_PROMPT }, 201);
  const conversationId = conversation.id as string;
  result(201, `conversation ${conversationId} on sandbox ${conversation.sandbox_id}`);
  const streamPath = `/api/conversations/${conversationId}/stream?blocks=true&wait=true`;
  out.line(`> GET ${streamPath} (SSE)`);
  await followFirstTurn(`${base}${streamPath}`, key, out);

  out.line(`> GET /api/conversations/${conversationId}/turns`);
  const turns = await settledTurns(base, conversationId, key);
  const turn = turns[0] as Turn;
  const usage = turn.usage ? `, usage ${turn.usage.input} in / ${turn.usage.output} out` : '';
  const error = turn.error ? `: ${turn.error.message}` : '';
  result(200, `turn ${turn.id} ${turn.state}${usage}${error}`);
  return { key, conversationId, turn };
}

/** The newest mail to `to` whose subject asks to verify, waited for (mail is sent after the reply). */
async function mailTo(dir: string, to: string) {
  for (let i = 0; ; i++) {
    const files = (await readdir(dir).catch(() => [] as string[])).filter((f) => f.endsWith('.json')).sort();
    for (const f of files.reverse()) {
      const file = join(dir, f);
      const mail = JSON.parse(await readFile(file, 'utf8')) as { to: string; subject: string; text: string };
      if (mail.to === to && /verif/i.test(mail.subject)) return { file, ...mail };
    }
    if (i >= 200) throw new StepFailed(`no verification mail to ${to} in ${dir}`);
    await sleep(50);
  }
}

/**
 * Prints the stream until the first turn ends: stages as short lines, the agent's text as it
 * arrives, each tool call and result on its own line. EventSource reconnects with
 * Last-Event-ID should the connection drop, so nothing is printed twice or missed.
 */
function followFirstTurn(url: string, key: string, out: Lines): Promise<void> {
  const line = (text: string) => out.line(text);
  return new Promise((resolve, reject) => {
    const es = new EventSource(url, {
      fetch: (input, init) =>
        fetch(input, { ...init, headers: { ...(init?.headers ?? {}), authorization: `Bearer ${key}` } }),
    });
    let opening: { id: string | undefined; summary: string | undefined } | undefined;
    es.addEventListener('message', (m) => {
      const event = JSON.parse(m.data) as StreamEvent;
      if (event.kind === 'stage') {
        if (event.state === 'failed') line(`< stage ${event.stage} failed: ${short(event.data ?? '', 300)}`);
        else if (event.state === 'started' || event.stage === 'turn') line(`< stage ${event.stage} ${event.state}`);
        if (event.stage === 'turn' && TURN_ENDS.has(event.state ?? '')) {
          if (opening) line(`  tool call: ${opening.summary}`);
          es.close();
          resolve();
        }
        return;
      }
      for (const b of event.blocks ?? []) {
        // A call whose input is still streaming (`{}`) waits for what comes next: the update
        // of the same call that says what it does replaces it.
        if (opening && !(b.kind === 'tool_use' && b.id === opening.id)) line(`  tool call: ${opening.summary}`);
        opening = undefined;
        if (b.kind === 'text' && b.body) out.stream('  agent: ', b.body);
        else if (b.kind === 'tool_use' && b.body === '{}') opening = { id: b.id, summary: b.summary ?? b.name };
        else if (b.kind === 'tool_use') line(`  tool call: ${b.summary ?? b.name}`);
        else if (b.kind === 'tool_result') line(`  tool result: ${short(unfenced(b.body ?? ''), 200)}`);
      }
    });
    // A refused stream (not 200) is closed for good; a dropped one is retried by EventSource.
    es.addEventListener('error', (e) => {
      if (es.readyState !== EventSource.CLOSED) return;
      reject(new StepFailed(`the stream was refused: ${e.code ?? ''} ${e.message ?? ''}`.trim()));
    });
  });
}

/** The conversation's turns once the first has left `running` (its record follows the log). */
async function settledTurns(base: string, conversationId: string, key: string): Promise<Turn[]> {
  for (let i = 0; ; i++) {
    const res = await fetch(`${base}/api/conversations/${conversationId}/turns`, {
      headers: { authorization: `Bearer ${key}` },
    });
    const turns = ((await res.json()) as { data: Turn[] }).data;
    if (turns[0]?.state !== 'running' || i >= 100) return turns;
    await sleep(50);
  }
}
