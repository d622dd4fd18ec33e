import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';

const BIN = fileURLToPath(new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url));
const AGENT = fileURLToPath(new URL('./fixtures/scripted-acp-agent.ts', import.meta.url));

/** The command line of the scripted ACP agent (tsx named by its absolute location: runtimes start in their sandbox). */
export const SCRIPTED_AGENT_COMMAND = `${process.execPath} --import ${import.meta.resolve('tsx')} ${AGENT}`;

/**
 * A real `svc-runner` process connected to the service with `token`, its sandboxes under a
 * fresh root, with `args` added to its command line. Resolves once it says it is connected;
 * killed when the test ends.
 */
export async function startRunnerProcess(t: Test, url: string, token: string, args: string[] = []) {
  const root = mkdtempSync(join(tmpdir(), 'svc-runner-root-'));
  const child = spawn(process.execPath, [BIN, '--url', url, '--token', token, '--root', root, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
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
  for (let i = 0; i < 600 && !/connected as runner/.test(runner.output); i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  if (!/connected as runner/.test(runner.output)) throw new Error(`svc-runner did not connect: ${runner.output}`);
  return runner;
}
