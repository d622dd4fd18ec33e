// `npm run demo` as a newcomer runs it: its script as a child process on a free port with its
// own data directory, the real Claude Code agent answering through the local stand-in model.
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { collectOutput } from './child-output.ts';
import { DEMO_PROMPT } from './demo/walkthrough.ts';
import { blockText } from './real-runtime.ts';
import { frames, parseFrame, rawGet, type WireEvent } from './sse-client.ts';

const DEMO = fileURLToPath(new URL('../demo.mjs', import.meta.url));
const ROOT_PACKAGE = fileURLToPath(new URL('../../package.json', import.meta.url));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Every process below `pid` now, from /proc: each with its command line. */
function descendants(pid: number): { pid: number; cmd: string }[] {
  const parentOf = new Map<number, number>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // The command name in field 2 may hold spaces and parentheses; fields after the last ')'.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      parentOf.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {}
  }
  const found: number[] = [];
  let frontier = [pid];
  while (frontier.length) {
    frontier = [...parentOf].filter(([, parent]) => frontier.includes(parent)).map(([child]) => child);
    found.push(...frontier);
  }
  return found.map((p) => {
    let cmd = '';
    try {
      cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8').replaceAll('\0', ' ');
    } catch {}
    return { pid: p, cmd };
  });
}

/** Whether `pid` is still a live process (a zombie waiting to be reaped is not). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/** Waits until the output matches `done` or the process exits (or 100 s pass, within the file's timeout). */
async function outputUntil(child: ChildProcess, output: () => string, done: RegExp) {
  for (let i = 0; i < 2000 && !done.test(output()) && child.exitCode === null; i++) await sleep(50);
}

t.test(
  'npm run demo runs a claude turn against the stand-in model, prints each API call and the answer, serves the conversation over SSE, and stops cleanly on SIGTERM',
  async (t) => {
    const dataDir = mkdtempSync(join(tmpdir(), 'svc-demo-'));
    const child = spawn(process.execPath, [DEMO], {
      env: { ...process.env, PORT: '0', DEMO_DATA_DIR: dataDir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const { out, err, exited } = collectOutput(child);
    t.teardown(async () => {
      if (child.exitCode === null) child.kill('SIGKILL');
      rmSync(dataDir, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
    });

    t.equal(
      JSON.parse(readFileSync(ROOT_PACKAGE, 'utf8')).scripts.demo,
      'exec node test/demo.mjs',
      'what npm run demo runs',
    );
    await outputUntil(child, out, /API reference: /);
    const said = () => `stdout:\n${out()}\nstderr:\n${err()}`;
    t.match(out(), /API reference: /, said());

    // The calls a user would make, in order, each printed before its result.
    const calls = out()
      .split('\n')
      .filter((l) => l.startsWith('> '))
      .map((l) =>
        l
          .slice(2)
          .split(' ')
          .slice(0, 2)
          .join(' ')
          .replace(/[a-z]{3}_[0-9a-z]{26}/g, ':id'),
      );
    t.same(
      calls,
      [
        'POST /api/auth/register',
        'POST /api/auth/verify',
        'POST /api/auth/token',
        'PUT /api/account/inference-credentials/anthropic_api_key',
        'POST /api/environments',
        'POST /api/agents',
        'POST /api/conversations',
        'GET /api/conversations/:id/stream?blocks=true&wait=true',
        'GET /api/conversations/:id/turns',
      ],
      'the API calls, in order',
    );
    t.match(out(), `$ cat ${join(dataDir, 'mail')}/`, 'the verification token read from the mail file');
    t.match(out(), /^< 201 \{"key":"svc_/m, 'the key');
    t.match(out(), /^< 200 turn trn_\w+ done, usage \d+ in \/ \d+ out$/m, 'the finished turn, with its usage');
    t.match(out(), /^ {2}tool call: pwd$/m, 'the tool call, saying what it runs');
    t.notMatch(out(), /tool call: Terminal/, 'not the placeholder title of a call still streaming');
    t.match(out(), `tool result: ${join(dataDir, 'local-sandboxes')}/`, "and its result: the sandbox's directory");
    t.equal(
      out().match(/^ {2}\(stand-in model API: POST \/v1\/messages/gm)?.length,
      2,
      "the stand-in's two Messages calls, each on a line of its own",
    );
    t.match(out(), /^ {2}agent: Hello! I am not a real model/m, "the agent's answer, as it arrived");
    t.match(out(), `You said: "${DEMO_PROMPT}"`, 'echoing the prompt');

    // The conversation stays there to look at, with the printed key.
    const base = /the service on (http:\/\/[\d.:]+)/.exec(out())?.[1] as string;
    const curl =
      /curl -N '\S+\/api\/conversations\/(cnv_\w+)\/stream\?blocks=true' -H 'authorization: Bearer (svc_\S+)'/.exec(
        out(),
      );
    t.ok(base && curl, 'the printed curl for the SSE stream');
    const [, conversationId, key] = curl ?? [];
    const watch = rawGet({ url: base }, `/api/conversations/${conversationId}/stream?blocks=true`, {
      authorization: `Bearer ${key}`,
    });
    await watch.closed;
    const events = frames(watch.text())
      .map(parseFrame)
      .filter((e) => e.data !== undefined)
      .map((e) => JSON.parse(e.data as string) as WireEvent);
    t.ok(
      events.some((e) => e.stage === 'turn' && e.state === 'done'),
      'the stream holds the finished turn',
    );
    const reply = blockText(events, 'text');
    t.match(reply, /^Hello! I am not a real model/, 'the reply events, text rebuilt');
    t.match(reply, `You said: "${DEMO_PROMPT}"`);
    t.ok(
      events.flatMap((e) => e.blocks ?? []).some((b) => b.kind === 'tool_use'),
      'and the tool call',
    );

    // SIGTERM stops the service, its runner-agent and the runtimes it started, and exits 0.
    const below = descendants(child.pid as number);
    t.ok(
      below.some((p) => p.cmd.includes('svc-runner')),
      `a local runner-agent runs below the demo: ${JSON.stringify(below)}`,
    );
    child.kill('SIGTERM');
    t.equal(await exited, 0, said());
    t.match(out(), /\nStopping the service, its runner-agent and the stand-in\.\n$/, 'saying so');
    t.same(
      below.filter((p) => alive(p.pid)),
      [],
      'no process of the demo is left',
    );
    t.ok(existsSync(join(dataDir, 'postgres', 'PG_VERSION')), 'the data stayed in the data directory it was given');
  },
);

t.test('npm run demo on a port that is taken says so and starts nothing', async (t) => {
  const holder = createServer();
  await new Promise<void>((r) => holder.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => holder.close(() => r())));
  const port = (holder.address() as AddressInfo).port;
  const dataDir = mkdtempSync(join(tmpdir(), 'svc-demo-'));
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }));
  const child = spawn(process.execPath, [DEMO], {
    env: { ...process.env, PORT: String(port), DEMO_DATA_DIR: dataDir },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const { out, err, exited } = collectOutput(child);
  t.equal(await exited, 1, err());
  t.equal(
    err(),
    `Port ${port} on 127.0.0.1 is taken (is \`npm start\` or another demo running?).\n` +
      'Stop it, or run the demo on another port: PORT=8081 npm run demo\n',
  );
  t.equal(out(), '', 'nothing started');
  t.same(readdirSync(dataDir), [], 'and nothing was written');
});
