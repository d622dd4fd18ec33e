import { spawn } from 'node:child_process';
import { mkdtempSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';
import type { TestService } from './harness.ts';

const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));
const AGENT = fileURLToPath(new URL('./fixtures/scripted-acp-agent.ts', import.meta.url));
/** Its compiled form, which `npm test` builds before the run (test/run.mjs). */
const AGENT_BUILT = fileURLToPath(new URL('../../.tap/fixtures/scripted-acp-agent.mjs', import.meta.url));

/**
 * The argv of the scripted ACP agent: its build when that is newer than the source (a third of
 * the start-up), else the source through tsx (named by its absolute location: runtimes start in
 * their sandbox).
 */
export const SCRIPTED_AGENT_ARGV: string[] =
  (statSync(AGENT_BUILT, { throwIfNoEntry: false })?.mtimeMs ?? 0) >= statSync(AGENT).mtimeMs
    ? [process.execPath, AGENT_BUILT]
    : [process.execPath, '--import', import.meta.resolve('tsx'), AGENT];

/** The same as one command line (RUNTIME_<NAME>_COMMAND). */
export const SCRIPTED_AGENT_COMMAND = SCRIPTED_AGENT_ARGV.join(' ');

/** Whether a process with this pid is running. */
export function alive(pid: number | undefined): boolean {
  if (pid === undefined) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * A real `svc-runner` process connected to the service with `token`, its sandboxes under
 * `opts.root` (default a fresh directory), with `args` added to its command line and
 * `opts.env` to its environment (the settings of its machine). Resolves once it says it is
 * connected; killed when the test ends.
 */
export async function startRunnerProcess(
  t: Test,
  url: string,
  token: string,
  args: string[] = [],
  /** `until`: what its output must show before this resolves (default: that it connected). */
  opts: { root?: string; env?: Record<string, string>; until?: RegExp } = {},
) {
  const root = opts.root ?? mkdtempSync(join(tmpdir(), 'svc-runner-root-'));
  const child = spawn(process.execPath, [BIN, '--url', url, '--token', token, '--root', root, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(opts.env ? { env: { ...process.env, ...opts.env } } : {}),
  });
  const runner = { child, root, output: '' };
  child.stdout.on('data', (d) => {
    runner.output += d;
  });
  child.stderr.on('data', (d) => {
    runner.output += d;
  });
  t.teardown(() => {
    child.kill('SIGKILL');
  });
  const until = opts.until ?? /connected as runner/;
  for (let i = 0; i < 600 && !until.test(runner.output); i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  if (!until.test(runner.output)) throw new Error(`svc-runner did not show ${until}: ${runner.output}`);
  return runner;
}

/**
 * An environment `main` (with the fields of `environment`), an agent `coder` on runtime
 * `claude` (on `provider`, else the instance's default) and an Anthropic credential: what a
 * launch needs besides a runner.
 */
export async function claudeAgent(
  t: Test,
  http: TestService['http'],
  token: string,
  provider?: 'runner',
  environment: Record<string, unknown> = {},
) {
  const env = (await http.post('/api/environments', { token, body: { name: 'main', ...environment } })).body;
  const created = await http.post('/api/agents', {
    token,
    body: {
      name: 'coder',
      runtime: 'claude',
      model: 'anthropic/claude-sonnet-4-5',
      environment_id: env.id,
      ...(provider ? { sandbox_provider: provider } : {}),
    },
  });
  t.equal(created.status, 201, `the agent is saved: ${created.text}`);
  const credential = await http.put('/api/account/inference-credentials/anthropic_api_key', {
    token,
    body: { value: 'sk-ant-test-credential-123456' },
  });
  t.equal(credential.status, 200, 'the credential is stored');
  return { env, agent: created.body };
}

/**
 * What most runner tests start from: `claudeAgent` on provider `runner`, and a real
 * svc-runner connected with the account's runner token.
 */
export async function claudeOnRunner(t: Test, svc: Pick<TestService, 'url' | 'http'>, token: string) {
  const { http } = svc;
  const { env, agent } = await claudeAgent(t, http, token, 'runner');
  const runnerRow = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const runner = await startRunnerProcess(t, svc.url, runnerRow.token);
  return { env, agent, runnerRow, runner };
}
