// The service started as the image starts it, `node gateway/start.mjs` with no npm in between
// (so no node_modules/.bin on PATH), from another directory, on its default runtime commands:
// a `local` turn runs the real Claude Code through the claude-agent-acp the service ships,
// against the demo's stand-in for the Anthropic API.
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { collectOutput } from './child-output.ts';
import { startStandInModel } from './demo/stand-in.ts';
import { Lines, walkthrough } from './demo/walkthrough.ts';
import { until } from './until.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const START = join(REPO, 'gateway', 'start.mjs');

/** The PATH of a shell that never ran npm: no node_modules/.bin, nothing inside this checkout. */
const plainPath = (process.env.PATH ?? '')
  .split(delimiter)
  .filter((dir) => dir && !dir.includes('node_modules') && !dir.startsWith(REPO))
  .join(delimiter);

t.test('node gateway/start.mjs, without npm, runs a local claude turn on the agent CLI it ships', async (t) => {
  const calls: string[] = [];
  const standIn = await startStandInModel((line) => calls.push(line));
  t.teardown(() => standIn.close());
  const dataDir = mkdtempSync(join(tmpdir(), 'svc-plain-start-'));
  // Only what an operator's shell holds: no RUNTIME_<NAME>_COMMAND, no npm_* variables.
  const env = {
    PATH: plainPath,
    HOME: process.env.HOME ?? dataDir,
    PORT: '0',
    DATA_DIR: dataDir,
    LOG_LEVEL: 'warn',
    SHUTDOWN_GRACE_MS: '2000',
    ANTHROPIC_BASE_URL: standIn.url,
  };
  t.notMatch(env.PATH, /node_modules/, 'PATH names no node_modules/.bin');
  const service: ChildProcess = spawn(process.execPath, [START], {
    cwd: tmpdir(),
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  const { both: output } = collectOutput(service);
  t.teardown(async () => {
    if (service.exitCode === null && service.signalCode === null) {
      const exited = new Promise((resolve) => service.once('exit', resolve));
      service.kill('SIGTERM');
      const timer = setTimeout(() => process.kill(-(service.pid as number), 'SIGKILL'), 20_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dataDir, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
  });
  const base = await until(
    'the banner',
    () => {
      if (service.exitCode !== null) throw new Error(`the service exited (${service.exitCode}):\n${output()}`);
      return /listening on (\S+)/.exec(output())?.[1];
    },
    90_000,
  );

  let said = '';
  const { turn } = await walkthrough({
    base,
    mailDir: join(dataDir, 'mail'),
    out: new Lines((text) => {
      said += text;
    }),
  });
  const log = `the walkthrough:\n${said}\nthe service:\n${output().slice(-3000)}`;
  t.match(turn, { state: 'done', error: null }, log);
  t.equal(calls.length, 2, `Claude Code called the stand-in twice: the tool call, then the answer\n${log}`);
  t.match(said, /agent: .*Hello! What are you, and where do you run\?/s, 'the agent answered, echoing the prompt');
});
