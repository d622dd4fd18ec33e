import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { accessSync, constants, lstatSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { delimiter, dirname, isAbsolute, join, resolve, sep } from 'node:path';
import type { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { SYSTEM_TRUST_BUNDLES } from './broker.ts';
import type { RunAs } from './run-as.ts';
import { seccompProgram } from './seccomp.ts';

/**
 * `namespaces`: each sandbox's processes run in namespaces of their own (bubblewrap); `none`:
 * as plain processes of the runner's machine (`--isolation none`, SANDBOX_ISOLATION=none).
 */
export type IsolationMode = 'namespaces' | 'none';

export const ISOLATION_MODES: readonly IsolationMode[] = ['namespaces', 'none'];

/** The user sandbox processes run as when the runner is root and names no `--run-as` user. */
const NOBODY = 'nobody';

/** Where a sandbox's egress sockets appear inside its namespaces. */
export const BRIDGE_DIR = '/run/svc';

/**
 * What a confined process reaches of the runner: the ports on the sandbox's own loopback that
 * lead out, each relayed to `<socketDir>/<port>.sock` on the runner's side (its egress proxy,
 * and the service's and model provider's ports when they are on the runner's loopback).
 */
export interface Bridges {
  socketDir: string;
  ports: number[];
}

/**
 * A command line as it runs confined: what to spawn instead (bwrap and its arguments, from
 * `/`) and the user to spawn it as (the sandbox's; absent: the runner's own). Throws an
 * ENOENT Error when `command` is not found on the PATH of `env`, as spawn would.
 */
export type Confine = (
  command: string,
  args: string[],
  cwd: string,
  env: Record<string, string>,
  /**
   * Files the command runs from that the operator named (a runtime's command line: its
   * executable, an interpreter's script), shown read-only with their project where they lie
   * in a path the sandbox does not see. Never a tenant's argument.
   */
  show?: readonly string[],
) => Confined;

export interface Confined {
  command: string;
  args: string[];
  cwd: string;
  uid?: number;
  gid?: number;
  /** The seccomp filter bubblewrap reads from the child's fd 3 (see spawnConfined). */
  seccomp?: Buffer;
  /**
   * Set when what is spawned is bubblewrap: a signal to it ends everything inside at once
   * (SIGKILL, --die-with-parent), so a graceful end signals what it confines (signalConfined).
   */
  confined?: true;
}

/** The pids of every process below `pid` (its children, theirs, and so on), read from /proc. */
function descendantsOf(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // pid (comm) state ppid ...: the comm may hold spaces and parentheses.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // gone meanwhile
    }
  }
  const found: number[] = [];
  for (let queue = [pid]; queue.length > 0; ) {
    const next = children.get(queue.shift() as number) ?? [];
    found.push(...next);
    queue.push(...next);
  }
  return found;
}

/**
 * Sends `signal` to every process confined by the bubblewrap process `pid` (the command and
 * all it started, in whatever session or group), but not to bubblewrap's own: ending them ends
 * the sandbox at once. So a SIGTERM gives a runtime its time to write its last files.
 */
export function signalConfined(pid: number, signal: NodeJS.Signals): void {
  for (const p of descendantsOf(pid)) {
    try {
      if (readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'bwrap') continue;
      process.kill(p, signal);
    } catch {
      // gone meanwhile
    }
  }
}

/** The fd bubblewrap reads a sandbox's seccomp filter from (`--seccomp`). */
const SECCOMP_FD = 3;

/**
 * Spawns `run` (a command as it runs confined, or as it is): in its cwd, as its user, with
 * `stdio` for fds 0 to 2 and, when it carries a seccomp filter, a pipe on fd 3 that the filter
 * is written to and closed (bubblewrap reads it to its end before it starts the command).
 */
export function spawnConfined(
  run: Confined,
  options: { env: NodeJS.ProcessEnv; stdio: ('pipe' | 'ignore')[]; detached?: boolean },
): ChildProcess {
  const child = spawn(run.command, run.args, {
    cwd: run.cwd,
    env: options.env,
    detached: options.detached ?? false,
    stdio: [...options.stdio, ...(run.seccomp ? (['pipe'] as const) : [])],
    ...(run.uid !== undefined ? { uid: run.uid, gid: run.gid } : {}),
  });
  if (run.seccomp) {
    const filter = child.stdio[SECCOMP_FD] as Writable;
    // EPIPE when bubblewrap exits before reading it: its exit says why.
    filter.on('error', () => {});
    filter.end(run.seccomp);
  }
  return child;
}

/**
 * Runs in the sandbox's namespaces before the command: one socat relay per bridged port (a
 * TCP listener on the sandbox's 127.0.0.1 to the runner's Unix socket for it), a wait of at
 * most 5 s until all of them listen (read from /proc/net/tcp, so a request made at once does
 * not meet a closed port), then the command itself in its place.
 */
export function bridgeScript(ports: number[]): string {
  if (ports.length === 0) return 'exec "$@"';
  const hex = ports.map((p) => `0A:0100007F:${p.toString(16).toUpperCase().padStart(4, '0')}`);
  return [
    `for p in ${ports.join(' ')}; do socat TCP-LISTEN:$p,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:${BRIDGE_DIR}/$p.sock 2>/dev/null & done`,
    'n=0; while [ $n -lt 1000 ]; do up=0',
    `  while read -r _ l _ st _; do case "$st:$l" in ${hex.join('|')}) up=$((up+1));; esac; done < /proc/net/tcp`,
    `  [ $up -ge ${ports.length} ] && break; n=$((n+1)); sleep 0.005`,
    'done',
    'exec "$@"',
  ].join('\n');
}

/** `command` as spawn would find it on `path` (a name with a slash is taken as it is); null when absent. */
export function findCommand(command: string, path: string, cwd: string): string | null {
  const candidates = command.includes('/')
    ? [resolve(cwd, command)]
    : path.split(delimiter).flatMap((d) => (d ? [join(resolve(cwd, d), command)] : []));
  for (const c of candidates) {
    try {
      accessSync(c, constants.X_OK);
      if (statSync(c).isFile()) return c;
    } catch {
      // not there, or not executable
    }
  }
  return null;
}

/** The machine's directories a sandbox has private ones of. */
const PRIVATE_DIRS = ['/tmp', '/var/tmp', '/run'];

/**
 * The top-level directories of the system a sandbox sees (read-only). Every other one (/home,
 * /root, /srv, /mnt, /media, a /work or /data of the operator's) is hidden, and in /var what
 * daemons keep (their state, often their Unix sockets, and logs, spools and mail).
 */
const SYSTEM_DIRS = new Set([
  'bin',
  'sbin',
  'lib',
  'lib32',
  'lib64',
  'libx32',
  'usr',
  'etc',
  'opt',
  'var',
  'nix',
  'snap',
]);
const SYSTEM_MOUNTS = new Set(['dev', 'proc', 'sys', 'tmp', 'run']);
const DAEMON_DIRS = ['/var/lib', '/var/log', '/var/spool', '/var/mail', '/var/backups'];

/** The machine's directories a sandbox does not see (see SYSTEM_DIRS). */
function unsystemDirs(): string[] {
  const top = readdirSync('/', { withFileTypes: true })
    .filter((d) => d.isDirectory() && !SYSTEM_DIRS.has(d.name) && !SYSTEM_MOUNTS.has(d.name))
    .map((d) => `/${d.name}`);
  return [...top, ...DAEMON_DIRS.filter((p) => lstatSync(p, { throwIfNoEntry: false })?.isDirectory())];
}

/**
 * The nearest directory holding a node_modules directory from `dir` up (`dir` itself
 * included): the project a file there belongs to. Undefined when there is none.
 */
function projectOf(dir: string): string | undefined {
  for (let p = dir; p !== dirname(p); p = dirname(p)) {
    if (isDirectory(join(p, 'node_modules'))) return p;
  }
  return undefined;
}

/** Whether `path` is `parent` or lies under it. */
function within(path: string, parent: string): boolean {
  return path === parent || path.startsWith(parent.endsWith(sep) ? parent : parent + sep);
}

function depth(path: string): number {
  return path.split(sep).filter(Boolean).length;
}

/** A regular file, not a symbolic link (bubblewrap binds onto it as it is). */
function isFile(path: string): boolean {
  try {
    return lstatSync(path).isFile();
  } catch {
    return false;
  }
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

/**
 * Whether `user` may look `path` up: search permission on each directory above it and on it
 * (bubblewrap, started as that user, fails on a path it cannot reach).
 */
function reachableBy(path: string, user: RunAs): boolean {
  for (let p = path; ; p = dirname(p)) {
    try {
      const { uid, gid, mode } = statSync(p);
      const bit = uid === user.uid ? 0o100 : gid === user.gid ? 0o010 : 0o001;
      if ((mode & bit) === 0) return false;
    } catch {
      return false;
    }
    if (p === dirname(p)) return true;
  }
}

/**
 * How this runner isolates its sandboxes (DECISIONS "Sandboxes that hold"). In mode
 * `namespaces` every process of a sandbox (its setup script, clones and npm installs, the
 * runtime and all it starts) runs under bubblewrap in its own user, mount, pid, ipc, uts and
 * network namespaces, with no capabilities, `no_new_privs`, no further user namespaces, a
 * seccomp filter (seccomp.ts) and `--die-with-parent`, so nothing of it outlives the
 * runner-agent. It sees the system's directories read-only (SYSTEM_DIRS), its own directory
 * read-write, a private `/tmp`, `/run`, `/dev` and `/proc`, and nothing else of the machine:
 * not the runner's root (other sandboxes), nor the runner's HOME, nor the `hidden` paths (the
 * service's DATA_DIR for the `local` provider), nor any other top-level directory or daemon's
 * state, save what it runs from (see shown). Its network namespace holds only loopback: the
 * bridges to the runner's egress proxy are the one way out. A runner that is root runs
 * sandboxes as its `--run-as` user, else as `nobody`, so files of the machine's users stay
 * theirs.
 */
export class Isolation {
  private constructor(
    readonly mode: IsolationMode,
    /** The user sandbox processes run as; absent: the runner's own. */
    readonly user: RunAs | undefined,
    /** Why sandboxes cannot be isolated here (mode `namespaces` only); then none is started. */
    readonly unavailable: string | undefined,
    private readonly hidden: string[],
    /** The seccomp filter sandbox processes run under (undefined: none for this architecture). */
    private readonly seccomp: Buffer | undefined = seccompProgram(),
  ) {}

  private shownPaths: string[] | undefined;

  /**
   * What the sandbox sees again, read-only, of a path it does not see (a hidden one, or the
   * machine's /tmp, /var/tmp and /run, which it has private ones of): the directories of the
   * runner's PATH there (a project's whole directory for its node_modules/.bin: the runtimes'
   * CLIs), node's own prefix, and the project the runner-agent is installed in (the runtimes a
   * workspace installs, the runner's own `mcp-bridge`). Hidden paths below one of them stay
   * hidden: they are mounted after it (see bwrapArgs).
   */
  private shown(): string[] {
    if (this.shownPaths) return this.shownPaths;
    const covered = [...this.hidden, ...PRIVATE_DIRS];
    // Strictly inside a path it does not see: /tmp itself is never shown again, nor anything above.
    const under = (path: string) => covered.some((h) => within(path, h) && path !== h);
    const shown = new Set<string>();
    for (const entry of (process.env.PATH ?? '').split(delimiter)) {
      // npm puts every ancestor's node_modules/.bin on PATH, most of them absent.
      if (!isAbsolute(entry) || !isDirectory(entry)) continue;
      const project = /^(.*)\/node_modules\/\.bin$/.exec(entry)?.[1] ?? entry;
      if (under(project)) shown.add(project);
    }
    const nodePrefix = dirname(dirname(process.execPath));
    if (under(nodePrefix)) shown.add(nodePrefix);
    // The project the runner-agent runs from (this workspace's root), or a global install's lib.
    const install = projectOf(dirname(fileURLToPath(import.meta.url)));
    if (install && under(install)) shown.add(install);
    this.shownPaths = [...shown].filter((path) => isDirectory(path) && (!this.user || reachableBy(path, this.user)));
    return this.shownPaths;
  }

  /**
   * Where `files` (absolute paths the operator named) come from, for those in a path the
   * sandbox does not see: the nearest directory above each holding a node_modules (its
   * project), else the file's own directory.
   */
  private projectsOf(files: readonly string[]): string[] {
    const covered = [...this.hidden, ...PRIVATE_DIRS];
    const out: string[] = [];
    for (const file of files) {
      if (!isAbsolute(file) || !isFile(file)) continue;
      const project = projectOf(dirname(file)) ?? dirname(file);
      if (!covered.some((h) => within(project, h) && project !== h)) continue;
      if (!this.user || reachableBy(project, this.user)) out.push(project);
    }
    return out;
  }

  /** No isolation: sandbox processes are the runner's own (`--isolation none`). */
  static none(runAs?: RunAs): Isolation {
    return new Isolation('none', runAs, undefined, []);
  }

  /**
   * Checks that this machine can isolate (bwrap and socat installed, user namespaces allowed,
   * a tmpfs over `root` possible for the sandbox user) by starting one empty sandbox, and
   * resolves with the isolation to use. It never rejects: what is missing is kept in
   * `unavailable`, and every sandbox build then fails saying so.
   */
  static async probe(options: {
    mode: IsolationMode;
    root: string;
    hidden?: string[];
    runAs?: RunAs;
  }): Promise<Isolation> {
    if (options.mode === 'none') return Isolation.none(options.runAs);
    const root = resolve(options.root);
    const home = process.env.HOME && isAbsolute(process.env.HOME) ? resolve(process.env.HOME) : undefined;
    const hidden = [
      ...new Set([root, ...(options.hidden ?? []).map((p) => resolve(p)), ...(home ? [home] : []), ...unsystemDirs()]),
    ]
      // `/` or a system directory is never hidden as a whole (a HOME of `/`).
      .filter((p) => depth(p) > 0 && !['/usr', '/bin', '/lib', '/etc'].some((s) => within(s, p)));
    let user = options.runAs;
    if (!user && process.getuid?.() === 0) user = lookupUser(NOBODY) ?? undefined;
    const isolation = new Isolation('namespaces', user, undefined, hidden);
    const missing = ['bwrap', 'socat'].filter((c) => !findCommand(c, process.env.PATH ?? '/usr/bin:/bin', '/'));
    if (missing.length > 0) {
      return isolation.withUnavailable(
        `${missing.join(' and ')} ${missing.length > 1 ? 'are' : 'is'} not installed (Debian: apt-get install bubblewrap socat)`,
      );
    }
    if (process.getuid?.() === 0 && !user)
      return isolation.withUnavailable(`there is no user ${NOBODY} to run sandboxes as`);
    const why = await isolation.tryOnce();
    return why ? isolation.withUnavailable(why) : isolation;
  }

  private withUnavailable(why: string): Isolation {
    return new Isolation(this.mode, this.user, why, this.hidden, this.seccomp);
  }

  /** The one line a start banner and stage `network` say about isolation. */
  describe(): string {
    if (this.mode === 'none') return 'none: sandbox processes run as plain processes of this machine';
    if (this.unavailable) return `unavailable: ${this.unavailable}`;
    const filter = this.seccomp ? 'a seccomp filter' : `no seccomp filter (none for ${process.arch})`;
    return `namespaces (bubblewrap), ${filter}${this.user ? `, as ${this.user.name}` : ''}`;
  }

  /** Throws, naming the cause and the setting, when sandboxes cannot be isolated here. */
  assertAvailable(): void {
    if (this.unavailable) {
      throw new Error(
        `sandboxes cannot be isolated on this machine: ${this.unavailable}; install what is missing, or run them without isolation (SANDBOX_ISOLATION=none on the service, --isolation none on svc-runner)`,
      );
    }
  }

  /**
   * The bubblewrap arguments that confine a process of the sandbox in `dir` (none: an empty
   * sandbox), up to and
   * including `--`. Mounts are made shallow-first: the hidden paths (each a fresh empty tmpfs),
   * the directories of the runner's PATH that lie in one of them shown again read-only (the
   * runtimes' CLIs, in a project's node_modules, or node under an nvm HOME), hidden paths
   * below those hidden again, then the sandbox's own directory and its bridge sockets.
   */
  bwrapArgs(
    dir: string | undefined,
    cwd: string,
    bridges: Bridges | undefined,
    trust?: string,
    show: readonly string[] = [],
  ): string[] {
    const shown = new Set([...this.shown(), ...this.projectsOf(show)]);
    const mounts = [
      ...this.hidden.map((path) => ({ path, args: ['--tmpfs', path] })),
      ...[...shown].map((path) => ({ path, args: ['--ro-bind', path, path] })),
    ].sort((a, b) => depth(a.path) - depth(b.path) || (a.args[0] === '--tmpfs' ? -1 : 1));
    return [
      '--unshare-user',
      '--unshare-pid',
      '--unshare-ipc',
      '--unshare-net',
      '--unshare-uts',
      '--unshare-cgroup-try',
      '--disable-userns',
      '--die-with-parent',
      '--new-session',
      '--cap-drop',
      'ALL',
      ...(this.seccomp ? ['--seccomp', String(SECCOMP_FD)] : []),
      '--hostname',
      'sandbox',
      '--ro-bind',
      '/',
      '/',
      '--dev',
      '/dev',
      '--proc',
      '/proc',
      '--tmpfs',
      '/tmp',
      '--tmpfs',
      '/var/tmp',
      '--tmpfs',
      '/run',
      '--tmpfs',
      '/dev/shm',
      ...mounts.flatMap((m) => m.args),
      ...(dir ? ['--bind', dir, dir] : []),
      ...(bridges ? ['--bind', bridges.socketDir, BRIDGE_DIR] : []),
      // A brokered sandbox's bundle, with its CA, stands in for the system's.
      ...(trust ? SYSTEM_TRUST_BUNDLES.filter(isFile).flatMap((path) => ['--ro-bind', trust, path]) : []),
      '--chdir',
      cwd,
      '--',
    ];
  }

  /**
   * The sandbox in `dir`'s confinement: undefined in mode `none` (processes are spawned as
   * they are). Throws when the machine cannot isolate (see assertAvailable).
   */
  confinement(dir: string, bridges: Bridges | undefined, trust?: string): Confine | undefined {
    if (this.mode === 'none') return undefined;
    this.assertAvailable();
    const script = bridgeScript(bridges?.ports ?? []);
    return (command, args, cwd, env, show = []) => {
      if (!findCommand(command, env.PATH ?? '', cwd)) {
        throw Object.assign(new Error(`spawn ${command} ENOENT`), { code: 'ENOENT', errno: -2, path: command });
      }
      return {
        command: 'bwrap',
        args: [
          ...this.bwrapArgs(dir, cwd, bridges, trust, show),
          '/bin/sh',
          '-c',
          script,
          'svc-sandbox',
          command,
          ...args,
        ],
        cwd: '/',
        ...(this.user ? { uid: this.user.uid, gid: this.user.gid } : {}),
        ...(this.seccomp ? { seccomp: this.seccomp } : {}),
        confined: true,
      };
    };
  }

  /** Starts `/bin/true` confined in an empty sandbox; resolves with why it failed, or undefined. */
  private tryOnce(): Promise<string | undefined> {
    const child = spawnConfined(
      {
        command: 'bwrap',
        args: [...this.bwrapArgs(undefined, '/', undefined), '/bin/true'],
        cwd: '/',
        ...(this.user ? { uid: this.user.uid, gid: this.user.gid } : {}),
        ...(this.seccomp ? { seccomp: this.seccomp } : {}),
      },
      { env: process.env, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let stderr = '';
    child.stderr?.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    return new Promise((done) => {
      child.on('error', (err) => done(`bubblewrap cannot start a sandbox here: ${err.message}`));
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        done(
          code === 0
            ? undefined
            : `bubblewrap cannot start a sandbox here: ${stderr.trim() || (signal ? `killed by ${signal}` : `exit ${code}`)}`,
        );
      });
    });
  }
}

/** The uid and gid of the user `name`, or null when there is none. */
export function lookupUser(name: string): RunAs | null {
  try {
    const id = (flag: string) => Number(execFileSync('id', [flag, name], { encoding: 'utf8' }).trim());
    return { name, uid: id('-u'), gid: id('-g') };
  } catch {
    return null;
  }
}
