// `npm test`: installs dependencies when missing, starts throwaway Redis and Postgres servers
// (installing Debian's redis-server and postgresql when absent and we are root), runs the
// whole suite against them and against the embedded defaults, stops them, and ends with the
// plain line `N passed, N failed` (test points). REDIS_URL / DATABASE_URL, when given, are
// used instead of starting servers. Arguments are test files to run (e.g. one alone); without
// any, every test/src/**/*.test.ts. TEST_JOBS files run at once; TEST_FILE_TIMEOUT_S is a
// file's limit unless it sets its own. TEST_CPU=1 also gives each file's CPU (user+sys of its
// process tree, by GNU time) after its time, and writes them all to .tap/cpu.json.
// TEST_COMMENTS=1 also prints the tests' own comments (t.comment). The files run compiled
// (buildTestFiles); TEST_TSX=1 runs them through tsx instead.
// Plain JavaScript: it must run before dependencies exist.
import { execFileSync, execSync, spawn } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const log = (msg) => process.stdout.write(`[test] ${msg}\n`);
const isRoot = process.getuid?.() === 0;
const children = [];
const scratch = [];

function haveCommand(cmd) {
  try {
    execSync(`command -v ${cmd}`, { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

let aptUpdated = false;
function aptInstall(pkgs) {
  if (!isRoot || !haveCommand('apt-get')) {
    throw new Error(`missing ${pkgs.join(', ')}: install them, or set REDIS_URL and DATABASE_URL`);
  }
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  if (!aptUpdated) {
    log('apt-get update');
    execSync('apt-get update -qq', { stdio: 'inherit', env });
    aptUpdated = true;
  }
  log(`apt-get install ${pkgs.join(' ')}`);
  execSync(`apt-get install -y -qq --no-install-recommends ${pkgs.join(' ')}`, { stdio: 'inherit', env });
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

async function waitFor(check, what, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      if (check()) return;
    } catch {}
    if (Date.now() > deadline) throw new Error(`${what} did not start within ${timeoutMs / 1000}s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function ensureDependencies() {
  if (existsSync(join(root, 'node_modules', 'tap')) && existsSync(join(root, 'node_modules', 'tsx'))) return;
  log('installing dependencies (npm ci)');
  execSync('npm ci --no-audit --no-fund', { cwd: root, stdio: 'inherit' });
}

async function startRedis() {
  if (!haveCommand('redis-server')) aptInstall(['redis-server']);
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'svc-test-redis-'));
  scratch.push(dir);
  const child = spawn(
    'redis-server',
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
      '--maxmemory-policy',
      'noeviction',
    ],
    { stdio: 'ignore' },
  );
  children.push(child);
  await waitFor(() => {
    execFileSync('redis-cli', ['-p', String(port), 'ping'], { stdio: 'pipe' });
    return true;
  }, 'redis-server');
  log(`redis-server on port ${port}`);
  return `redis://127.0.0.1:${port}`;
}

function postgresBin() {
  const base = '/usr/lib/postgresql';
  if (!existsSync(base)) return undefined;
  const versions = readdirSync(base)
    .filter((v) => existsSync(join(base, v, 'bin', 'initdb')))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] ? join(base, versions[0], 'bin') : undefined;
}

async function startPostgres() {
  let bin = postgresBin();
  if (!bin) {
    aptInstall(['postgresql']);
    bin = postgresBin();
    if (!bin) throw new Error('postgresql installed but initdb not found under /usr/lib/postgresql');
  }
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'svc-test-pg-'));
  scratch.push(dir);
  chmodSync(dir, 0o700);
  // PostgreSQL refuses to run as root: run it as the postgres user.
  const asUser = isRoot ? ['runuser', '-u', 'postgres', '--'] : [];
  if (isRoot) {
    const uid = Number(execSync('id -u postgres').toString());
    const gid = Number(execSync('id -g postgres').toString());
    chownSync(dir, uid, gid);
  }
  const run = (cmd, args, opts = {}) =>
    asUser.length ? execFileSync(asUser[0], [...asUser.slice(1), cmd, ...args], opts) : execFileSync(cmd, args, opts);
  run(join(bin, 'initdb'), ['-D', join(dir, 'data'), '-U', 'svc', '--auth=trust', '-E', 'UTF8', '--no-sync'], {
    stdio: 'pipe',
  });
  const args = [
    '-D',
    join(dir, 'data'),
    '-p',
    String(port),
    '-k',
    dir,
    '-c',
    'listen_addresses=127.0.0.1',
    '-c',
    'fsync=off',
    '-c',
    'synchronous_commit=off',
    '-c',
    'full_page_writes=off',
    '-c',
    'max_connections=300',
  ];
  const child = asUser.length
    ? spawn(asUser[0], [...asUser.slice(1), join(bin, 'postgres'), ...args], { stdio: 'ignore' })
    : spawn(join(bin, 'postgres'), args, { stdio: 'ignore' });
  children.push(child);
  await waitFor(() => {
    execFileSync(join(bin, 'pg_isready'), ['-h', '127.0.0.1', '-p', String(port), '-U', 'svc'], { stdio: 'pipe' });
    return true;
  }, 'postgres');
  log(`postgres (${bin.split('/').at(-2)}) on port ${port}`);
  return `postgres://svc@127.0.0.1:${port}/postgres`;
}

function stopAll() {
  for (const c of children) if (c.exitCode === null) c.kill('SIGTERM');
  for (const d of scratch) rmSync(d, { recursive: true, force: true });
}

// ---------------------------------------------------------------------------------------------
// The scheduler: every test file in a node process of its own (as tap's runner spawns them),
// TEST_JOBS at a time (default 4; the files of WAITS in a lane beside them), longest first by
// the times recorded in test/durations.json (files not listed there first of all: a new file
// may be long), so the longest files do not start last and leave the run waiting on them.
// Each file's time is written to .tap/durations.json after a run; copy it over
// test/durations.json to keep the order current.

const durationsFile = join(root, 'test', 'durations.json');
const recordedFile = join(root, '.tap', 'durations.json');
/** GNU time, which TEST_CPU=1 runs each file under to read its CPU; undefined otherwise. */
const CPU_TIME = process.env.TEST_CPU === '1' && existsSync('/usr/bin/time') ? '/usr/bin/time' : undefined;
/**
 * Seconds a file's process may outlive its tests (loading and tearing down take up to 6 s on a
 * loaded machine) before the run says so.
 */
const LINGER_S = 10;
/** The per-file limit, in seconds: a file that runs longer is killed and fails. */
const FILE_TIMEOUT_S = positiveInteger('TEST_FILE_TIMEOUT_S', 180);
/**
 * Files run at once, besides the lane of WAITS. Four: a full run's files spent 887 s of CPU in
 * 3,972 s of their times (54eea39 in a fresh clone, TEST_CPU=1, three at a time), so most of a
 * file's time is waiting (a runner, a sandbox, a deadline) and two cores take more.
 */
const JOBS = positiveInteger('TEST_JOBS', 4);
/**
 * Files that mostly wait: the bench's smoke runs, whose scenarios load the service for set
 * durations and leave the cores idle for much of theirs (longest first put three side by
 * side at the start of a clean-clone run, and the CPU was 55% idle over the five minutes they
 * took). They run one at a time in a lane of their own beside the TEST_JOBS lanes, which take
 * them up too once the rest is begun.
 */
const WAITS = /(^|\/)bench-smoke-[^/]*\.test\.ts$/;

/** A setting from the environment that must be a whole number above 0; a typo stops the run. */
function positiveInteger(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) {
    process.stderr.write(`[test] ${name} must be a whole number above 0, not ${JSON.stringify(raw)}\n`);
    process.exit(2);
  }
  return n;
}

/** Every process below `pid` (by parent pid in /proc), deepest last; none where there is no /proc. */
function descendantsOf(pid) {
  const parents = new Map();
  for (const name of existsSync('/proc') ? readdirSync('/proc') : []) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      parents.set(Number(name), ppid);
    } catch {} // exited meanwhile
  }
  const found = [];
  for (let i = -1, at = pid; i < found.length; at = found[++i]) {
    for (const [p, pp] of parents) if (pp === at) found.push(p);
  }
  return found;
}

function testFiles(args) {
  if (args.length) return args;
  const found = [];
  const walk = (dir) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.test.ts')) found.push(path.slice(root.length + 1));
    }
  };
  walk(join(root, 'test', 'src'));
  return found.sort();
}

/** User+sys seconds from GNU time's `%U %S` in `file`; undefined when it wrote none. */
function cpuSeconds(file) {
  try {
    const [user, sys] = readFileSync(file, 'utf8').trim().split(/\s+/).slice(-2).map(Number);
    return Number.isFinite(user + sys) ? user + sys : undefined;
  } catch {
    return undefined;
  }
}

function readDurations(file) {
  try {
    return JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    return {};
  }
}

/**
 * The test files compiled, each with what it imports of the workspace, into .tap/build (one
 * esbuild run, their shared code split into chunks), so a file's process loads plain
 * JavaScript: through tsx, loading the gateway costs a test file 1 to 2 s more CPU, which 124
 * files pay on a machine the suite keeps busy. A map of file to its build; undefined (the
 * files then run through tsx, as TEST_TSX=1 makes them) when they cannot be built.
 */
async function buildTestFiles(files, serviceBuilt) {
  if (process.env.TEST_TSX === '1') return undefined;
  const outdir = join(root, '.tap', 'build');
  try {
    const [{ build }, { WORKSPACE_BUILD, CHILD_BUNDLE }] = await Promise.all([
      import('esbuild'),
      import('../gateway/bundle.mjs'),
    ]);
    rmSync(outdir, { recursive: true, force: true });
    await build({
      ...WORKSPACE_BUILD,
      entryPoints: files.map((f) => resolve(root, f)),
      outdir,
      outbase: root,
      outExtension: { '.js': '.mjs' },
      splitting: true,
      sourcemap: 'linked',
      // A service a test starts forks its other edge processes from their build, as npm start's.
      define: serviceBuilt ? { SVC_EDGE_CHILD: JSON.stringify(CHILD_BUNDLE) } : {},
    });
    return new Map(files.map((f) => [f, join(outdir, relative(root, resolve(root, f)).replace(/\.ts$/, '.mjs'))]));
  } catch (err) {
    log(`the test files could not be built (${String(err?.message ?? err).split('\n')[0]}); they run through tsx`);
    return undefined;
  }
}

async function runFile(file, built, env, Parser, counts, failures) {
  const began = Date.now();
  // Count leaf test points: an assert that is not the summary of a subtest.
  const parser = new Parser({ bail: false }, () => {});
  let seen = 0;
  /** The time of the file's top-level tests, summed: what its process needed of its lifetime. */
  let testsMs = 0;
  const watch = (p, path) => {
    const parents = new Set();
    p.on('child', (child) => {
      parents.add(child.name);
      watch(child, [...path, child.name]);
    });
    // TEST_COMMENTS=1 shows what tests print with t.comment (a transcript), indented as nested.
    if (process.env.TEST_COMMENTS === '1' && path.length > 0) {
      p.on('comment', (line) => {
        if (!/^\s*# (Subtest|time=)/.test(line)) process.stdout.write(line.replace(/^\s*# ?/, '  '));
      });
    }
    p.on('assert', (res) => {
      if (path.length === 0 && typeof res.time === 'number') testsMs += res.time;
      if (parents.has(res.name)) return;
      seen++;
      if (res.todo) counts.todo++;
      else if (res.skip) counts.skipped++;
      else if (res.ok) counts.passed++;
      else {
        counts.failed++;
        failures.push({ ...res, fullname: [file, ...path, res.name].join(' > ') });
      }
    });
  };
  watch(parser, []);
  // The file times itself out (TAP_TIMEOUT, or its own t.setTimeout, which tap reports over IPC
  // as it does to its own runner) and says so; this kill, 30 s later, is for a file that hangs.
  const GRACE_MS = 30_000;
  let limitMs = FILE_TIMEOUT_S * 1000 + GRACE_MS;
  const argv = built ? ['--enable-source-maps', built] : ['--import=tsx', '--conditions=svc-workspace', file];
  // TEST_CPU=1: the file's CPU (user+sys of its process tree, what it waited for) by GNU time.
  const cpuFile = CPU_TIME ? join(root, '.tap', 'cpu', `${counts.files + 1}.txt`) : undefined;
  const [command, args] = cpuFile
    ? [CPU_TIME, ['-q', '-f', '%U %S', '-o', cpuFile, process.execPath, ...argv]]
    : [process.execPath, argv];
  const child = spawn(command, args, {
    cwd: root,
    env: { ...env, TAP: '1', TAP_TIMEOUT: String(FILE_TIMEOUT_S), TAP_CHILD_ID: String(counts.files + 1) },
    stdio: ['ignore', 'pipe', 'inherit', 'ipc'],
  });
  child.on('message', (m) => {
    if (m && typeof m.setTimeout === 'number') limitMs = m.setTimeout + GRACE_MS;
  });
  counts.files++;
  child.stdout.on('data', (chunk) => parser.write(chunk));
  let timedOut = false;
  const check = setInterval(() => {
    if (Date.now() - began > limitMs && !timedOut) {
      timedOut = true;
      // What the file started (services, npm start trees, runner-agents) goes with it, so a
      // hung file does not leave load on the rest of the run.
      for (const p of [child.pid, ...descendantsOf(child.pid)]) {
        try {
          process.kill(p, 'SIGKILL');
        } catch {} // gone already
      }
    }
  }, 1000);
  const code = await new Promise((resolve) => child.on('close', (c, signal) => resolve(c ?? signal)));
  clearInterval(check);
  parser.end();
  const ms = Date.now() - began;
  const ok = code === 0 && parser.ok !== false && !timedOut;
  if (!ok) {
    counts.failedFiles++;
    const why = timedOut ? `timed out after ${Math.round(limitMs / 1000)} s` : `exit ${code}`;
    failures.push({ fullname: `${file} (${why}, ${seen} test points seen)`, diag: {} });
  }
  counts.ended++;
  const cpu = cpuFile ? cpuSeconds(cpuFile) : undefined;
  const cpuNote = cpu === undefined ? '' : ` cpu=${cpu.toFixed(1)}s`;
  // A process that outlives its tests by seconds is held open by something they left (a timer,
  // a child, a poll): it costs the run that time for nothing.
  const idle = testsMs > 0 ? (ms - testsMs) / 1000 : 0;
  const idleNote = idle > LINGER_S ? ` (${idle.toFixed(1)} s of it after its tests)` : '';
  process.stdout.write(`${ok ? 'ok' : 'not ok'} ${counts.ended} - ${file} # time=${ms}ms${cpuNote}${idleNote}\n`);
  return { ms, cpu };
}

async function runTests(env, serviceBuilt) {
  const { Parser } = await import('tap-parser');
  const args = process.argv.slice(2);
  const files = testFiles(args);
  const known = { ...readDurations(durationsFile), ...readDurations(recordedFile) };
  const order = [...files].sort(
    (a, b) => (known[b] ?? Number.POSITIVE_INFINITY) - (known[a] ?? Number.POSITIVE_INFINITY),
  );
  const built = await buildTestFiles(files, serviceBuilt);
  if (CPU_TIME) {
    rmSync(join(root, '.tap', 'cpu'), { recursive: true, force: true });
    mkdirSync(join(root, '.tap', 'cpu'), { recursive: true });
  }
  const jobs = JOBS;
  const counts = { passed: 0, failed: 0, skipped: 0, todo: 0, files: 0, ended: 0, failedFiles: 0 };
  const failures = [];
  const times = {};
  const cpus = {};
  const waiting = order.filter((f) => WAITS.test(f));
  const queue = order.filter((f) => !WAITS.test(f));
  const lane = async (...queues) => {
    for (const q of queues) {
      for (let file = q.shift(); file; file = q.shift()) {
        const { ms, cpu } = await runFile(file, built?.get(file), env, Parser, counts, failures);
        times[file] = ms;
        if (cpu !== undefined) cpus[file] = Math.round(cpu * 10) / 10;
      }
    }
  };
  // TEST_JOBS lanes take the rest, then what the lane of the waiting files has not begun yet.
  await Promise.all([
    lane(waiting),
    ...Array.from({ length: Math.min(jobs, order.length) }, () => lane(queue, waiting)),
  ]);
  for (const f of failures) {
    const { source: _source, ...diag } = f.diag ?? {};
    const text = Object.keys(diag).length ? JSON.stringify(diag, null, 2) : '';
    process.stdout.write(
      `\nFAILED: ${f.fullname ?? f.name}\n${text.length > 3000 ? `${text.slice(0, 3000)}...` : text}\n`,
    );
  }
  if (!args.length) {
    mkdirSync(dirname(recordedFile), { recursive: true });
    const sorted = Object.fromEntries(Object.entries(times).sort(([, a], [, b]) => b - a));
    writeFileSync(recordedFile, `${JSON.stringify(sorted, null, 2)}\n`);
  }
  if (CPU_TIME) {
    const total = Object.values(cpus).reduce((a, b) => a + b, 0);
    const sorted = Object.fromEntries(Object.entries(cpus).sort(([, a], [, b]) => b - a));
    writeFileSync(join(root, '.tap', 'cpu.json'), `${JSON.stringify(sorted, null, 2)}\n`);
    log(`CPU of the files: ${total.toFixed(1)} s (.tap/cpu.json)`);
  }
  log(`${counts.files} files, ${counts.skipped} skipped, ${counts.todo} todo`);
  return { passed: counts.passed, failed: counts.failed + counts.failedFiles, code: counts.failedFiles ? 1 : 0 };
}

const started = Date.now();
let result = { passed: 0, failed: 1, code: 1 };
try {
  ensureDependencies();
  // Runner-agents start from their compiled bundle (a third of a second, against two through tsx).
  const { ensureBundle } = await import('../runner-agent/bundle.mjs');
  ensureBundle(); // says why when it cannot
  // And `npm start`, which tests run as a user does, from the service's (gateway/bundle.mjs).
  const service = await import('../gateway/bundle.mjs');
  const serviceBuilt = await service.ensureBundle();
  // And the bench's target, which the bench's smoke files start many times, and its CLI with the
  // processes it forks, which they run 13 times (bench/bundle.mjs).
  const { ensureServeBundle, ensureCliBundle } = await import('../bench/bundle.mjs');
  await ensureServeBundle();
  await ensureCliBundle();
  // So does the scripted ACP agent that stands in for the runtimes (test/src/runner-process.ts).
  const { build } = await import('esbuild');
  await build({
    entryPoints: [join(root, 'test', 'src', 'fixtures', 'scripted-acp-agent.ts')],
    outfile: join(root, '.tap', 'fixtures', 'scripted-acp-agent.mjs'),
    bundle: true,
    packages: 'external',
    platform: 'node',
    target: 'node20',
    format: 'esm',
    logLevel: 'warning',
  });
  // The runner's build clones repositories with git (tests clone local bare repositories).
  if (!haveCommand('git')) aptInstall(['git']);
  // Uploads are tested with curl itself (it sends Expect: 100-continue for large bodies).
  if (!haveCommand('curl')) aptInstall(['curl']);
  // Sandboxes run isolated: bubblewrap, and socat for their bridges out of the network namespace.
  const isolation = ['bubblewrap', 'socat'].filter((p) => !haveCommand(p === 'bubblewrap' ? 'bwrap' : p));
  if (isolation.length > 0) aptInstall(isolation);
  // The docs page is tested in a real browser (playwright-core drives Debian's Chromium).
  if (!haveCommand('chromium')) aptInstall(['chromium']);
  const env = { ...process.env, NODE_ENV: 'test' };
  env.TEST_REDIS_URL = process.env.REDIS_URL || (await startRedis());
  env.TEST_DATABASE_URL = process.env.DATABASE_URL || (await startPostgres());
  delete env.REDIS_URL;
  delete env.DATABASE_URL;
  result = await runTests(env, serviceBuilt);
} catch (err) {
  process.stdout.write(`\n[test] ${err.stack ?? err}\n`);
} finally {
  stopAll();
}
log(`wall time ${((Date.now() - started) / 1000).toFixed(1)}s`);
if (result.code !== 0 && result.failed === 0) result.failed = 1;
process.stdout.write(`${result.passed} passed, ${result.failed} failed\n`);
process.exit(result.failed === 0 && result.code === 0 ? 0 : 1);
