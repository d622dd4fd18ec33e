import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import type { WireEvent } from './sse-client.ts';

/*
 * The runner as an operator meets it: the package is packed, installed from its tarball into an
 * empty directory outside this repository, and started there from its installed bin; a turn of
 * a conversation runs on it. The service's own command for `claude` does not exist anywhere, so
 * the turn runs only because the runner's machine names its agent (RUNTIME_CLAUDE_COMMAND).
 * The package is not on the npm registry, and must not get there by accident: the name is
 * not ours, so an install by name would fetch whatever someone else published under it.
 */

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const PACKAGE_DIR = join(REPO, 'runner-agent');
/** The installed size the package must stay under (the agents' own CLIs are not in it). */
const SIZE_GOAL_MB = 15;

/**
 * An environment that knows nothing of this repository: no `npm_*` settings from the `npm test`
 * that runs us (one of them names this repository as npm's project), and no PATH entry inside it;
 * npm does not look for a newer npm.
 */
function machineEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const path = (process.env.PATH ?? '')
    .split(delimiter)
    .filter((dir) => dir && !dir.startsWith(REPO))
    .join(delimiter);
  return { PATH: path, HOME: process.env.HOME ?? tmpdir(), npm_config_update_notifier: 'false', ...extra };
}

/** Every file under `dir` whose name matches `pattern`. */
function filesUnder(dir: string, pattern: RegExp): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' }).filter((f) => pattern.test(f));
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('svc-runner installed from its tarball into an empty directory runs a turn', async (t) => {
  const scratch = mkdtempSync(join(tmpdir(), 'svc-runner-package-'));
  t.teardown(() => rmSync(scratch, { recursive: true, force: true }));

  // Built here rather than by npm pack's prepack script, which an npm set to ignore scripts skips.
  execFileSync(process.execPath, ['build.mjs'], { cwd: PACKAGE_DIR, stdio: 'pipe' });
  const packed = execFileSync('npm', ['pack', '--silent', '--ignore-scripts', '--pack-destination', scratch], {
    cwd: PACKAGE_DIR,
    encoding: 'utf8',
    env: { ...process.env, npm_config_loglevel: 'error' },
  });
  const tarball = join(scratch, packed.trim().split('\n').at(-1) ?? '');
  const contents = execFileSync('tar', ['-tzf', tarball], { encoding: 'utf8' }).trim().split('\n').sort();
  t.same(
    contents,
    [
      'package/README.md',
      'package/dist/THIRD_PARTY_LICENSES.txt',
      'package/dist/svc-runner.js',
      'package/package.json',
      'package/svc-runner.service',
    ],
    'the package holds the compiled runner, its README, its systemd unit and nothing else',
  );
  const manifest = JSON.parse(execFileSync('tar', ['-xOzf', tarball, 'package/package.json'], { encoding: 'utf8' }));
  const targets = (value: unknown): string[] =>
    typeof value === 'string' ? [value] : Object.values(value ?? {}).flatMap(targets);
  const named = [...targets(manifest.exports), ...targets(manifest.bin), ...targets(manifest.main)];
  t.same(
    named.filter((file) => !contents.includes(`package/${file.replace(/^\.\//, '')}`)),
    [],
    `every file its exports and bin name is in it (${named.join(', ')})`,
  );
  t.equal(manifest.private, true, 'it is private: npm refuses to publish it');
  // A publish of the tarball to a registry on a closed local port: refused before any request.
  const publish = spawnSync(
    'npm',
    ['publish', tarball, '--registry', 'http://127.0.0.1:9/', '--//127.0.0.1:9/:_authToken=not-a-token'],
    { cwd: scratch, env: machineEnv(), encoding: 'utf8' },
  );
  t.match(
    { status: publish.status, stderr: publish.stderr },
    { status: 1, stderr: /EPRIVATE/ },
    'npm publish of the packed tarball is refused as private',
  );

  const machine = join(scratch, 'machine');
  mkdirSync(machine);
  writeFileSync(join(machine, 'package.json'), '{"name": "runner-machine", "private": true}\n');
  execFileSync('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error', tarball], {
    cwd: machine,
    env: machineEnv(),
    stdio: 'pipe',
  });
  const kib = Number(execFileSync('du', ['-sk', 'node_modules'], { cwd: machine, encoding: 'utf8' }).split('\t')[0]);
  const size = `${(kib / 1024).toFixed(1)} MB (du -sk node_modules after npm install <tarball>)`;
  process.stderr.write(`[runner-package] installed size: ${size}\n`);
  t.ok(kib < SIZE_GOAL_MB * 1024, `the installed runner takes under ${SIZE_GOAL_MB} MB: ${size}`);
  t.same(
    filesUnder(join(machine, 'node_modules'), /(\.node|binding\.gyp)$/),
    [],
    'no native module is installed with it',
  );

  const installed = (args: string[]) =>
    spawnSync(join(machine, 'node_modules', '.bin', 'svc-runner'), args, { env: machineEnv(), encoding: 'utf8' });
  t.match(
    installed(['--help']).stdout,
    /--token-file.*\n.*sees it in `ps`/,
    '--help says where the token is best kept',
  );
  const root = join(scratch, 'root');
  const noFile = installed(['--url', 'http://127.0.0.1:9', '--token-file', join(scratch, 'missing'), '--root', root]);
  t.match(
    { status: noFile.status, stderr: noFile.stderr },
    { status: 2, stderr: /svc-runner: error: cannot read the token file .*missing/ },
    'an unreadable token file is a usage error (exit 2)',
  );
  const openFile = join(scratch, 'open-token');
  writeFileSync(openFile, 'svcr_not_a_real_token\n', { mode: 0o644 });
  const open = installed(['--url', 'http://127.0.0.1:9', '--token-file', openFile, '--root', root]);
  t.match(
    { status: open.status, stderr: open.stderr },
    { status: 4, stderr: /warning: .*open-token is open to other users \(mode 644\); chmod 600 it/ },
    'a token file others can read is used, with a warning (here the service is unreachable: exit 4)',
  );

  const svc = await startTestService(t, { env: { RUNTIME_CLAUDE_COMMAND: 'svc-test-no-such-agent-acp' } });
  const { http } = svc;
  const { key: token } = await signUp(svc);
  const { agent } = await claudeAgent(t, http, token, 'runner');
  const runnerRow = (await http.post('/api/runners', { token, body: { name: 'installed' } })).body;
  const tokenFile = join(scratch, 'token');
  writeFileSync(tokenFile, `${runnerRow.token}\n`, { mode: 0o600 });

  // Its installed bin, as README says (never `npx svc-runner`, which would fetch the name from
  // the registry where it is not installed); in its own process group for the teardown.
  const runner: ChildProcess = spawn(
    join(machine, 'node_modules', '.bin', 'svc-runner'),
    ['--url', svc.url, '--token-file', tokenFile, '--root', root],
    {
      cwd: machine,
      env: machineEnv({ RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND }),
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    },
  );
  let output = '';
  runner.stdout?.on('data', (d) => {
    output += d;
  });
  runner.stderr?.on('data', (d) => {
    output += d;
  });
  t.teardown(() => {
    if (runner.pid && runner.exitCode === null) process.kill(-runner.pid, 'SIGKILL');
  });
  for (let i = 0; i < 600 && !/connected as runner/.test(output); i++) await sleep(50);
  t.match(output, /connected as runner/, 'the installed runner connects with the token from its file');
  t.match(
    output,
    `svc-runner: runtime claude: ${SCRIPTED_AGENT_COMMAND} (set on this machine)`,
    'it says which runtime command this machine sets',
  );

  const created = await http.post('/api/conversations', {
    token,
    body: { agent_id: agent.id, prompt: 'hello from an installed runner' },
  });
  t.equal(created.status, 201, created.text);
  const id = created.body.id as string;
  let turn: { id: string; state: string } | undefined;
  for (let i = 0; i < 600; i++) {
    turn = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data[0];
    if (turn && turn.state !== 'running') break;
    await sleep(50);
  }
  t.match(turn, { state: 'done' }, `the turn ran on the installed runner\n${output}`);
  const events = (await http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body
    .data as WireEvent[];
  const reply = events
    .filter((e) => e.turn_id === turn?.id)
    .flatMap((e) => e.blocks ?? [])
    .filter((b) => b.kind === 'text')
    .map((b) => b.body)
    .join('');
  t.match(reply, /^You said: hello from an installed runner\./, "this machine's agent gave the reply");
  for (let i = 0; i < 100 && !/ ended: /.test(output); i++) await sleep(50);
  t.match(output, `svc-runner: turn ${turn?.id} of conversation ${id} started\n`, 'the terminal shows the turn start');
  t.match(
    output,
    new RegExp(`svc-runner: turn ${turn?.id} of conversation ${id} ended: done after [0-9.]+ s\\n`),
    'and its end',
  );
});

t.test('the READMEs and the API reference install svc-runner from its tarball, never by its name', async (t) => {
  // POST /api/runners's description in the OpenAPI document says how to run the runner too.
  for (const file of ['README.md', 'runner-agent/README.md', 'gateway/src/api/routes/runners.ts']) {
    const text = readFileSync(join(REPO, file), 'utf8');
    t.notMatch(text, /npx\s+svc-runner/, `${file}: no npx svc-runner (npx fetches the name when it is not installed)`);
    t.notMatch(
      text,
      /npm\s+(install|i|add)\s+(-g\s+|--global\s+)?svc-runner\b/,
      `${file}: no npm install of svc-runner by name`,
    );
    t.notMatch(text, /svc-runner@(latest|\d)/, `${file}: no version of svc-runner from the registry`);
    t.match(text, /npm install -g \.\/svc-runner-[^\s`]*\.tgz/, `${file}: the install of the packed tarball`);
    t.match(text, /not on the npm registry/, `${file}: says why`);
  }
});
