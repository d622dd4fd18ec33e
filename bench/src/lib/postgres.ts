import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensurePackages } from './apt.ts';
import { freePort, startProcess } from './proc.ts';

export interface ThrowawayPostgres {
  url: string;
  pid: number;
  stop(): Promise<void>;
}

function postgresBin(): string | undefined {
  const base = '/usr/lib/postgresql';
  if (!existsSync(base)) return undefined;
  const versions = readdirSync(base)
    .filter((v) => existsSync(join(base, v, 'bin', 'initdb')))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] ? join(base, versions[0], 'bin') : undefined;
}

/**
 * A throwaway PostgreSQL cluster on a free loopback port (for scenarios that need several
 * processes on one database, or the database outside the service's process tree). Durability
 * is off (fsync, synchronous commit): the bench measures the service, not this machine's disk.
 * PostgreSQL refuses to run as root, so as root it runs as the `postgres` user.
 */
export async function startPostgres(say: (s: string) => void = () => {}): Promise<ThrowawayPostgres> {
  let bin = postgresBin();
  if (!bin) {
    ensurePackages(['postgresql'], say);
    bin = postgresBin();
    if (!bin) throw new Error('postgresql installed but initdb not found under /usr/lib/postgresql');
  }
  const isRoot = process.getuid?.() === 0;
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'svc-bench-pg-'));
  chmodSync(dir, 0o700);
  if (isRoot) {
    const uid = Number(execFileSync('id', ['-u', 'postgres']).toString());
    const gid = Number(execFileSync('id', ['-g', 'postgres']).toString());
    chownSync(dir, uid, gid);
  }
  const asUser = isRoot ? ['runuser', '-u', 'postgres', '--'] : [];
  const command = (cmd: string, args: string[]): [string, string[]] =>
    asUser.length ? [asUser[0] as string, [...asUser.slice(1), cmd, ...args]] : [cmd, args];
  const [initCmd, initArgs] = command(join(bin, 'initdb'), [
    '-D',
    join(dir, 'data'),
    '-U',
    'svc',
    '--auth=trust',
    '-E',
    'UTF8',
    '--no-sync',
  ]);
  execFileSync(initCmd, initArgs, { stdio: 'pipe' });
  const [cmd, args] = command(join(bin, 'postgres'), [
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
    'max_connections=500',
  ]);
  const started = await startProcess(cmd, args, {
    ready: /database system is ready to accept connections/,
    name: 'postgres',
  });
  return {
    url: `postgres://svc@127.0.0.1:${port}/postgres`,
    pid: started.child.pid as number,
    async stop() {
      await started.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
