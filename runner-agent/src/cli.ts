/**
 * `svc-runner`: connects this machine to the service as a self-hosted runner.
 *
 *   svc-runner --url https://svc.example.com --token svcr_... --root /srv/svc-runner [--name box1]
 *              [--output-memory-mb 8] [--run-as sandbox-user] [--allow-apt]
 *
 * The same through SVC_RUNNER_URL, SVC_RUNNER_TOKEN, SVC_RUNNER_ROOT, SVC_RUNNER_NAME,
 * SVC_RUNNER_OUTPUT_MEMORY_MB, SVC_RUNNER_RUN_AS, SVC_RUNNER_ALLOW_APT=1. `--run-as` (root only)
 * runs runtimes and setup scripts as that unprivileged user, and lets the runner fence that
 * user's traffic into its egress proxy with a firewall rule (see network.ts). `--allow-apt` lets
 * builds install environments' apt packages on this machine (as root, or through passwordless
 * sudo); without it a build with apt packages fails. It says
 * what it is doing in plain words and exits non-zero with a clear message when it cannot go on.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { AGENT_VERSION, type AgentStop, connectUrl, RunnerAgent } from './agent.ts';
import type { RunAs } from './network.ts';

/** Exit codes: 0 stopped by a signal; the rest say why it could not go on. */
export const EXIT: Record<AgentStop | 'usage', number> = {
  closed: 0,
  usage: 2,
  bad_url: 3,
  unreachable: 4,
  bad_token: 5,
  revoked: 6,
  replaced: 7,
  refused: 8,
};

const USAGE = `usage: svc-runner --url <service base URL> --token <runner token> --root <directory> [--name <name>]
                  [--output-memory-mb <MiB>] [--run-as <unprivileged user>] [--allow-apt]
  (or SVC_RUNNER_URL, SVC_RUNNER_TOKEN, SVC_RUNNER_ROOT, SVC_RUNNER_NAME, SVC_RUNNER_OUTPUT_MEMORY_MB,
   SVC_RUNNER_RUN_AS, SVC_RUNNER_ALLOW_APT=1)
--output-memory-mb: output not yet stored by the service kept in memory per sandbox (default 8);
  the rest waits on disk under <root>/spool.
--allow-apt: environments' apt packages may be installed on this machine (as root or with passwordless sudo)
Create a runner and its token in the service first: POST /api/runners {"name": "..."}.`;

function say(line: string): void {
  process.stdout.write(`svc-runner: ${line}\n`);
}
function fail(code: number, line: string): never {
  process.stderr.write(`svc-runner: error: ${line}\n`);
  process.exit(code);
}

const { values } = (() => {
  try {
    return parseArgs({
      options: {
        url: { type: 'string' },
        token: { type: 'string' },
        root: { type: 'string' },
        name: { type: 'string' },
        'output-memory-mb': { type: 'string' },
        'run-as': { type: 'string' },
        'allow-apt': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
        version: { type: 'boolean' },
      },
    });
  } catch (err) {
    fail(EXIT.usage, `${(err as Error).message}\n${USAGE}`);
  }
})();
if (values.help) {
  process.stdout.write(`${USAGE}\n`);
  process.exit(0);
}
if (values.version) {
  process.stdout.write(`${AGENT_VERSION}\n`);
  process.exit(0);
}
const url = values.url ?? process.env.SVC_RUNNER_URL;
const token = values.token ?? process.env.SVC_RUNNER_TOKEN;
const root = values.root ?? process.env.SVC_RUNNER_ROOT;
const name = values.name ?? process.env.SVC_RUNNER_NAME;
const outputMemoryMb = values['output-memory-mb'] ?? process.env.SVC_RUNNER_OUTPUT_MEMORY_MB;
const runAsName = values['run-as'] ?? process.env.SVC_RUNNER_RUN_AS;
const allowApt = values['allow-apt'] ?? process.env.SVC_RUNNER_ALLOW_APT === '1';
if (!url) fail(EXIT.usage, `--url is required\n${USAGE}`);
if (!token) fail(EXIT.usage, `--token is required\n${USAGE}`);
if (!root) fail(EXIT.usage, `--root is required\n${USAGE}`);
if (!token.startsWith('svcr_')) {
  fail(EXIT.bad_token, 'that is not a runner token (they start with svcr_); create one with POST /api/runners');
}
try {
  connectUrl(url);
} catch (err) {
  fail(EXIT.bad_url, `--url: ${(err as Error).message}`);
}
let outputMemory: { bytes: number } | undefined;
if (outputMemoryMb !== undefined) {
  const mb = Number(outputMemoryMb);
  if (!(mb > 0 && mb <= 4096))
    fail(EXIT.usage, `--output-memory-mb must be a number of MiB above 0, at most 4096 (got ${outputMemoryMb})`);
  outputMemory = { bytes: Math.round(mb * 1024 * 1024) };
}
const rootDir = resolve(root);
try {
  mkdirSync(rootDir, { recursive: true, mode: 0o700 });
} catch (err) {
  fail(EXIT.usage, `cannot use ${rootDir} as the sandbox root: ${(err as Error).message}`);
}

let runAs: RunAs | undefined;
if (runAsName) {
  if (process.getuid?.() !== 0)
    fail(EXIT.usage, '--run-as needs the runner to run as root (it starts processes as that user)');
  try {
    const id = (flag: string) => Number(execFileSync('id', [flag, runAsName], { encoding: 'utf8' }).trim());
    runAs = { name: runAsName, uid: id('-u'), gid: id('-g') };
  } catch {
    fail(EXIT.usage, `--run-as: no such user ${runAsName}`);
  }
  if (runAs.uid === 0) fail(EXIT.usage, `--run-as: ${runAsName} is root; name an unprivileged user`);
}

say(
  `runner-agent ${AGENT_VERSION}; sandboxes under ${rootDir}${runAs ? `; runtimes run as ${runAs.name} (uid ${runAs.uid})` : ''}${allowApt ? '; apt packages allowed' : ''}`,
);
const options = {
  url,
  token,
  root: rootDir,
  allowApt,
  ...(name ? { hostname: name } : {}),
  ...(outputMemory ? { outputMemory } : {}),
  ...(runAs ? { runAs } : {}),
};
const agent = new RunnerAgent(options, (e) => {
  switch (e.type) {
    case 'connecting':
      if (e.attempt === 1) say(`connecting to ${e.url}`);
      break;
    case 'connected':
      say(
        `${e.reconnected ? 'reconnected' : 'connected'} as runner ${e.runnerId} (connection ${e.epoch}); waiting for work`,
      );
      break;
    case 'disconnected':
      say(
        `connection lost (${e.code}${e.reason ? `: ${e.reason}` : ''}); trying again in ${(e.retryInMs / 1000).toFixed(1)} s`,
      );
      break;
    case 'sandbox':
      say(`sandbox ${e.id} ${e.state}${e.message ? `: ${e.message}` : ''}`);
      break;
    case 'recovered':
      say(
        `${e.events} events of ${e.incarnations} sandbox incarnation(s) kept from before a restart; they are sent again once connected` +
          (e.cutBytes ? ` (${e.cutBytes} bytes after a torn or damaged record were cut off)` : ''),
      );
      break;
    case 'output_lost':
      process.stderr.write(`svc-runner: warning: output of sandbox ${e.sandbox} could not be kept: ${e.message}\n`);
      break;
    case 'output_discarded':
      say(`${e.events} kept events of sandbox ${e.sandbox} discarded: ${e.reason}`);
      break;
    case 'stopped':
      break;
  }
});
agent.start();
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => agent.stop(`stopped by ${signal}`));
}
const { reason, message } = await agent.done;
if (reason === 'closed') {
  say(message);
  process.exit(0);
}
const advice: Partial<Record<AgentStop, string>> = {
  bad_token: 'check --token; a deleted runner’s token stops working',
  revoked: 'the owner deleted this runner; create a new one to connect again',
  replaced: 'another svc-runner started with this token; one token serves one machine',
  unreachable: 'check --url and that the service is running',
};
fail(EXIT[reason], `${message}${advice[reason] ? ` (${advice[reason]})` : ''}`);
