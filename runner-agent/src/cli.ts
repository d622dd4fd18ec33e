/**
 * `svc-runner`: connects this machine to the service as a self-hosted runner.
 *
 *   svc-runner --url https://svc.example.com --token-file /etc/svc-runner/token --root /srv/svc-runner
 *              [--name box1] [--output-memory-mb 8] [--run-as sandbox-user] [--allow-apt]
 *              [--isolation namespaces|none] [--hide <path>]...
 *
 * The same through SVC_RUNNER_URL, SVC_RUNNER_TOKEN (or SVC_RUNNER_TOKEN_FILE), SVC_RUNNER_ROOT,
 * SVC_RUNNER_NAME, SVC_RUNNER_OUTPUT_MEMORY_MB, SVC_RUNNER_RUN_AS, SVC_RUNNER_ALLOW_APT=1. The
 * token is best given by file or environment: `--token` shows in `ps` to every user of the
 * machine. RUNTIME_<NAME>_COMMAND in its environment replaces the service's command line for
 * that runtime on this machine (runtime-commands.ts). It prints one line when a turn starts
 * and one when it ends, with the conversation's id. `--run-as` (root only)
 * runs runtimes and setup scripts as that unprivileged user, and lets the runner fence that
 * user's traffic into its egress proxy with a firewall rule (see network.ts). `--allow-apt` lets
 * builds install environments' apt packages on this machine (as root, or through passwordless
 * sudo); without it a build with apt packages fails. `--isolation` (SVC_RUNNER_ISOLATION,
 * default `namespaces`) runs each sandbox's processes in namespaces of their own (bubblewrap;
 * isolation.ts); a machine that cannot isolate builds no sandbox, saying why, unless `none` is
 * given. `--hide` names a further path sandboxes must not see (repeatable). `--local-provider`
 * is passed by the service's `local` sandbox provider to the runner-agents it starts (their
 * turns run the service's runtime commands, which their errors then name); not for operators.
 * It says what it is doing in plain words and exits non-zero with a clear message when it
 * cannot go on.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { MCP_BRIDGE_COMMAND, RUNNER_CLOSE } from '@svc/core';
import { type AgentStop, connectUrl, RunnerAgent } from './agent.ts';
import { ISOLATION_MODES, Isolation, type IsolationMode } from './isolation.ts';
import { runMcpBridge } from './mcp-bridge.ts';
import type { RunAs } from './run-as.ts';
import { runtimeCommandsFrom } from './runtime-commands.ts';
import { AGENT_VERSION } from './version.ts';

// `svc-runner mcp-bridge <url>`: what a runtime without HTTP MCP runs as its stdio server.
if (process.argv[2] === MCP_BRIDGE_COMMAND) await runMcpBridge(process.argv.slice(3));

/**
 * Exit codes: 0 stopped by a signal; the rest say why it could not go on. (7 was "another
 * process took the token over": a runner whose token another live process holds now waits
 * and tries again instead.)
 */
export const EXIT: Record<AgentStop | 'usage', number> = {
  closed: 0,
  usage: 2,
  bad_url: 3,
  unreachable: 4,
  bad_token: 5,
  revoked: 6,
  refused: 8,
};

const USAGE = `usage: svc-runner --url <service base URL> --token-file <file> --root <directory> [--name <name>]
                  [--output-memory-mb <MiB>] [--run-as <unprivileged user>] [--allow-apt]
                  [--isolation namespaces|none] [--hide <path>]...
  (or SVC_RUNNER_URL, SVC_RUNNER_TOKEN_FILE, SVC_RUNNER_ROOT, SVC_RUNNER_NAME, SVC_RUNNER_OUTPUT_MEMORY_MB,
   SVC_RUNNER_RUN_AS, SVC_RUNNER_ALLOW_APT=1, SVC_RUNNER_ISOLATION)
--token-file: a file holding the runner token (svcr_...); or the token itself in SVC_RUNNER_TOKEN.
  --token <runner token> works too, but every user of this machine sees it in \`ps\`.
RUNTIME_CLAUDE_COMMAND, RUNTIME_CODEX_COMMAND, RUNTIME_GEMINI_COMMAND, RUNTIME_OPENCODE_COMMAND:
  the command line that starts that runtime's ACP agent on this machine, instead of the service's.
--output-memory-mb: output not yet stored by the service kept in memory per sandbox (default 8);
  the rest waits on disk under <root>/spool.
--allow-apt: environments' apt packages may be installed on this machine (as root or with passwordless sudo)
--isolation: namespaces (default) runs each sandbox in namespaces of its own with bubblewrap; it needs
  bubblewrap and socat (Debian: apt-get install bubblewrap socat) and unprivileged user namespaces
  (Linux). none runs sandbox processes as plain processes of this machine: only for a machine that
  holds nothing but sandboxes of one tenant you trust.
--hide: a path sandboxes must not see, besides --root and HOME (repeatable)
Create a runner and its token in the service first: POST /api/runners {"name": "..."}.`;

function say(line: string): void {
  process.stdout.write(`svc-runner: ${line}\n`);
}
function fail(code: number, line: string): never {
  process.stderr.write(`svc-runner: error: ${line}\n`);
  process.exit(code);
}

/**
 * The token in a token file: its first line, without surrounding blanks. A file open to other
 * users is used, with a warning: the token lets anyone act as this runner.
 */
function readToken(file: string | undefined): string | undefined {
  if (!file) return undefined;
  try {
    const text = readFileSync(file, 'utf8');
    const mode = statSync(file).mode & 0o777;
    if (mode & 0o077) {
      process.stderr.write(
        `svc-runner: warning: ${file} is open to other users (mode ${mode.toString(8)}); chmod 600 it\n`,
      );
    }
    return text.split('\n')[0]?.trim() || fail(EXIT.usage, `the token file ${file} is empty`);
  } catch (err) {
    fail(EXIT.usage, `cannot read the token file ${file}: ${(err as Error).message}`);
  }
}

const { values } = (() => {
  try {
    return parseArgs({
      options: {
        url: { type: 'string' },
        token: { type: 'string' },
        'token-file': { type: 'string' },
        root: { type: 'string' },
        name: { type: 'string' },
        'output-memory-mb': { type: 'string' },
        'run-as': { type: 'string' },
        'allow-apt': { type: 'boolean' },
        isolation: { type: 'string' },
        hide: { type: 'string', multiple: true },
        'local-provider': { type: 'boolean' },
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
if (values.token && values['token-file']) fail(EXIT.usage, `give --token or --token-file, not both\n${USAGE}`);
// The command line before the environment; in each, the token itself before a token file.
const token =
  values.token ??
  readToken(values['token-file']) ??
  process.env.SVC_RUNNER_TOKEN ??
  readToken(process.env.SVC_RUNNER_TOKEN_FILE);
const root = values.root ?? process.env.SVC_RUNNER_ROOT;
const name = values.name ?? process.env.SVC_RUNNER_NAME;
const outputMemoryMb = values['output-memory-mb'] ?? process.env.SVC_RUNNER_OUTPUT_MEMORY_MB;
const runAsName = values['run-as'] ?? process.env.SVC_RUNNER_RUN_AS;
const allowApt = values['allow-apt'] ?? process.env.SVC_RUNNER_ALLOW_APT === '1';
const isolationMode = values.isolation ?? process.env.SVC_RUNNER_ISOLATION ?? 'namespaces';
if (!(ISOLATION_MODES as readonly string[]).includes(isolationMode)) {
  fail(EXIT.usage, `--isolation must be ${ISOLATION_MODES.join(' or ')} (got ${isolationMode})`);
}
if (!url) fail(EXIT.usage, `--url is required\n${USAGE}`);
if (!token) fail(EXIT.usage, `--token-file (or SVC_RUNNER_TOKEN) is required\n${USAGE}`);
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

const runtimeCommands = runtimeCommandsFrom(process.env);

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
const isolation = await Isolation.probe({
  mode: isolationMode as IsolationMode,
  root: rootDir,
  hidden: (values.hide ?? []).map((p) => resolve(p)),
  ...(runAs ? { runAs } : {}),
});
if (isolation.unavailable) {
  process.stderr.write(
    `svc-runner: warning: sandboxes cannot be isolated here, so none will be built: ${isolation.unavailable}; install what is missing, or start with --isolation none\n`,
  );
} else say(`isolation: ${isolation.describe()}`);
for (const [runtime, line] of Object.entries(runtimeCommands)) say(`runtime ${runtime}: ${line} (set on this machine)`);
const options = {
  url,
  token,
  root: rootDir,
  allowApt,
  runtimeCommands,
  isolation,
  ...(values['local-provider'] ? { localProvider: true } : {}),
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
      if (e.code === RUNNER_CLOSE.taken || e.code === RUNNER_CLOSE.replaced) {
        say(
          `waiting: ${e.reason}; one token serves one machine, and the one connected keeps it; trying again in ${(e.retryInMs / 1000).toFixed(1)} s`,
        );
        break;
      }
      say(
        `connection lost (${e.code}${e.reason ? `: ${e.reason}` : ''}); trying again in ${(e.retryInMs / 1000).toFixed(1)} s`,
      );
      break;
    case 'sandbox':
      say(`sandbox ${e.id} ${e.state}${e.message ? `: ${e.message}` : ''}`);
      break;
    case 'turn':
      if (e.state === 'started') say(`turn ${e.turnId} of conversation ${e.conversationId} started`);
      else
        say(
          `turn ${e.turnId} of conversation ${e.conversationId} ended: ${e.state} after ${(e.durationMs / 1000).toFixed(1)} s${e.error ? ` (${e.error})` : ''}`,
        );
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
    case 'egress_dropped':
      process.stderr.write(
        `svc-runner: warning: ${e.rows} egress log rows were dropped while the service was out of reach\n`,
      );
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
  bad_token: 'check the token; a deleted runner’s token stops working',
  revoked: 'the owner deleted this runner; create a new one to connect again',
  unreachable: 'check --url and that the service is running',
};
fail(EXIT[reason], `${message}${advice[reason] ? ` (${advice[reason]})` : ''}`);
