/**
 * The embedded database: a PostgreSQL server that `npm start` runs as its child when no
 * DATABASE_URL is set. It stops cleanly with the service, it never outlives it (even when only
 * the service's node process is killed), a kill -9 of every process loses no write
 * the API acknowledged, and the service's pool runs queries side by side on it.
 */
import { existsSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { connectionOptions, startEmbedded } from '@svc/db';
import { loadConfig, startService } from '@svc/gateway';
import pino from 'pino';
import postgres from 'postgres';
import t, { type Test } from 'tap';
import { startTestService } from './harness.ts';
import { argv, descendants, gone, groupOf, npmStart, signUpAt, zombie } from './npm-start.ts';
import { until } from './until.ts';

/** The embedded server's processes under the service's node process (the postmaster and its workers). */
function postgresProcesses(node: number): number[] {
  return descendants(node).filter((p) => /\/postgres$/.test(argv(p)[0] ?? '') || /^postgres:/.test(argv(p)[0] ?? ''));
}

async function keptDir(t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'svc-test-embedded-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

async function call(url: string, key: string, method: string, path: string, body?: unknown) {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    ...(body ? { body: JSON.stringify(body) } : {}),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

t.test('npm start runs PostgreSQL under DATA_DIR and SIGTERM stops it cleanly', async (t) => {
  const svc = await npmStart(t);
  const pg = postgresProcesses(svc.node);
  t.ok(pg.length >= 1, `the server runs below the service (${pg.length} processes)`);
  t.ok(existsSync(join(svc.dataDir, 'postgres', 'PG_VERSION')), 'its cluster is DATA_DIR/postgres');
  t.match(svc.output(), /storage: embedded PostgreSQL 18\.\d+ in /, 'the banner names it');

  process.kill(svc.node, 'SIGTERM');
  await until('node to exit', () => gone(svc.node), 30_000);
  await until('the server to stop', () => pg.every(gone), 30_000).catch(() => undefined);
  t.same(
    pg.filter((p) => !gone(p)),
    [],
    'no server process is left',
  );
  t.notOk(existsSync(join(svc.dataDir, 'postgres', 'postmaster.pid')), 'a clean shutdown: no postmaster.pid');
});

t.test('kill -9 of every process (both groups) loses no acknowledged write', async (t) => {
  const dataDir = await keptDir(t);
  const first = await npmStart(t, { dataDir, group: true });
  const pg = postgresProcesses(first.node);
  const key = await signUpAt(first.url, dataDir);
  const made: string[] = [];
  for (let i = 0; i < 20; i++) {
    const res = await call(first.url, key, 'POST', '/api/environments', { name: `env-${i}` });
    t.equal(res.status, 201, `environment ${i} acknowledged`);
    made.push(res.body.id as string);
  }
  // The server runs in a group of its own (a Ctrl-C goes to the service first): both groups are
  // killed at once, as a machine's OOM killer or a container's stop would.
  const groups = [first.npm.pid as number, ...new Set(pg.map(groupOf))];
  for (const g of groups) {
    try {
      process.kill(-g, 'SIGKILL');
    } catch (err) {
      // The server's group may be gone already: it stops when the service's node dies.
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  }
  await until('every process of both groups to go', () => [first.node, ...pg].every(gone), 30_000);

  const second = await npmStart(t, { dataDir });
  const listed = await call(second.url, key, 'GET', '/api/environments?per_page=100');
  t.equal(listed.status, 200, 'the key made before the kill still works');
  const ids = (listed.body.data as { id: string }[]).map((e) => e.id);
  t.same(
    made.filter((id) => !ids.includes(id)),
    [],
    'every acknowledged environment is there after the restart',
  );
});

t.test('a Ctrl-C (SIGINT to the foreground group) drains the service before its server stops', async (t) => {
  const svc = await npmStart(t, { group: true, env: { LOG_LEVEL: 'info' } });
  const pg = postgresProcesses(svc.node);
  t.ok(
    pg.every((p) => groupOf(p) !== svc.npm.pid),
    "the server is not in the terminal's group: the signal reaches the service only",
  );
  const exit = new Promise<number | null>((resolve) => svc.npm.once('exit', (code) => resolve(code)));
  process.kill(-(svc.npm.pid as number), 'SIGINT');
  t.equal(await exit, 0, 'npm start exits 0');
  await until('the server to stop', () => pg.every(gone), 30_000).catch(() => undefined);
  t.same(
    pg.filter((p) => !gone(p)),
    [],
    'no server process is left',
  );
  t.notMatch(svc.output(), /exited unasked/, 'the server was stopped by the service, not by the signal');
  t.notOk(existsSync(join(svc.dataDir, 'postgres', 'postmaster.pid')), 'a clean shutdown: no postmaster.pid');
});

t.test("kill -9 of the service's node process alone: its server stops and the next start takes over", async (t) => {
  const dataDir = await keptDir(t);
  const first = await npmStart(t, { dataDir });
  const pg = postgresProcesses(first.node);
  const key = await signUpAt(first.url, dataDir);
  const before = await call(first.url, key, 'GET', '/api/auth/me');
  process.kill(first.node, 'SIGKILL');
  await until('the orphaned server to stop', () => pg.every(gone), 30_000).catch(() => undefined);
  t.same(
    pg.filter((p) => !gone(p)),
    [],
    'the server does not outlive the service',
  );
  const second = await npmStart(t, { dataDir });
  const me = await call(second.url, key, 'GET', '/api/auth/me');
  t.equal(me.status, 200);
  t.equal(me.body.email, before.body.email, 'the account is there after the restart');
  t.equal(me.body.email_verified, true);
});

t.test('a backend left running by a killed server is stopped before the next start on its data', async (t) => {
  const dir = join(await keptDir(t), 'postgres');
  const first = await startEmbedded({ dir });
  const sql = postgres({ ...connectionOptions(first.socketDir), max: 1, onnotice: () => {} });
  const [row] = await sql<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`;
  const backend = row?.pid as number;
  // A backend that cannot exit yet, as one in the middle of a disk flush when the group is killed.
  process.kill(backend, 'SIGSTOP');
  t.teardown(() => {
    if (!gone(backend)) process.kill(backend, 'SIGKILL');
  });
  process.kill(first.pid, 'SIGKILL');
  await until('the postmaster to go', () => gone(first.pid), 30_000);
  t.notOk(gone(backend), 'the backend outlives its postmaster (it holds the old shared memory)');

  const second = await startEmbedded({ dir });
  t.teardown(() => second.stop());
  t.ok(gone(backend), 'the leftover backend was stopped');
  const again = postgres({ ...connectionOptions(second.socketDir), max: 1, onnotice: () => {} });
  t.teardown(() => again.end({ timeout: 1 }));
  t.same(await again`SELECT 1 AS one`, [{ one: 1 }], 'the new server answers');
  sql.end({ timeout: 0 }).catch(() => {});
});

t.test(
  'a lock file naming a zombie (the killed postmaster, not collected yet) does not keep PostgreSQL from starting',
  async (t) => {
    const dir = join(await keptDir(t), 'postgres');
    const first = await startEmbedded({ dir });
    process.kill(first.pid, 'SIGKILL');
    await until('the postmaster to go', () => gone(first.pid), 30_000);
    // PostgreSQL itself asks only whether the pid exists, which a zombie does; one of another
    // user's it takes for no server of its own, so the zombie is the server's user's, as the
    // killed postmaster is.
    const pid = await zombie(t, await stat(dir));
    const lockFile = join(dir, 'postmaster.pid');
    const [, ...rest] = (await readFile(lockFile, 'utf8')).split('\n');
    await writeFile(lockFile, [String(pid), ...rest].join('\n'));

    const second = await startEmbedded({ dir });
    t.teardown(() => second.stop());
    t.equal(
      (await readFile(lockFile, 'utf8')).split('\n')[0],
      String(second.pid),
      'the new server holds the lock file',
    );
  },
);

t.test("the embedded server's environment holds none of the service's own", async (t) => {
  const secret = `svc-secret-${process.pid}-${Date.now()}`;
  const before = process.env.MASTER_KEY;
  process.env.MASTER_KEY = secret;
  t.teardown(() => {
    if (before === undefined) delete process.env.MASTER_KEY;
    else process.env.MASTER_KEY = before;
  });
  const server = await startEmbedded({ dir: join(await keptDir(t), 'postgres') });
  t.teardown(() => server.stop());
  const environ = readFileSync(`/proc/${server.pid}/environ`, 'utf8').split('\0');
  t.notOk(
    environ.some((v) => v.includes(secret)),
    'the master key is not in the postmaster environment',
  );
  t.ok(
    environ.some((v) => v.startsWith('PATH=')),
    'it has what it needs (PATH)',
  );
});

t.test("throwaway clusters live in this user's own directory, not one another user made", async (t) => {
  const tmp = await keptDir(t);
  await chmod(tmp, 0o711); // as /tmp lets the server's user through (it runs as postgres under root)
  const before = process.env.TMPDIR;
  process.env.TMPDIR = tmp;
  t.teardown(() => {
    if (before === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = before;
  });
  const own = join(tmp, `svc-pg-${process.getuid?.()}`);
  // Another user got there first: the directory is theirs (root tests as nobody's), or, as any
  // user, it is open to everyone's writes.
  await mkdir(own, { mode: 0o777 });
  await chmod(own, 0o777);
  if (process.getuid?.() === 0) await chown(own, 65534, 65534);
  await t.rejects(startEmbedded({}), /is not this user's own directory/, 'a start on it is refused');
  await rm(own, { recursive: true });
  const server = await startEmbedded({});
  t.teardown(() => server.stop());
  const made = await stat(own);
  t.equal(made.uid, process.getuid?.(), 'made by this user');
  t.equal(made.mode & 0o022, 0, 'writable by nobody else');
  t.ok(server.dir.startsWith(`${own}/`), 'the cluster is inside it');
});

t.test('the service pool runs queries side by side on the embedded server', async (t) => {
  const svc = await startTestService(t, { backend: 'embedded' });
  t.equal(svc.db.kind, 'embedded');
  // Eight sleeps at once (a query runs once awaited), and a look at the server's sessions meanwhile.
  const sleeps = Promise.all(Array.from({ length: 8 }, () => svc.db.sql`SELECT pg_sleep(1.5)`));
  const active = await until(
    'several sessions to run the sleep',
    async () => {
      const [row] = await svc.db.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM pg_stat_activity WHERE state = 'active' AND query = 'SELECT pg_sleep(1.5)'`;
      return (row?.n ?? 0) >= 2 ? row?.n : undefined;
    },
    10_000,
  ).catch(() => 0);
  await sleeps;
  t.ok((active ?? 0) >= 2, `${active} sessions ran the sleep at once (the pool is not one queued connection)`);
});

t.test('data an earlier version kept with PGlite is named at start, not silently dropped', async (t) => {
  const dataDir = await keptDir(t);
  await mkdir(join(dataDir, 'pglite'));
  let logged = '';
  const sink = new Writable({
    write(chunk, _enc, done) {
      logged += chunk.toString();
      done();
    },
  });
  const config = loadConfig({ PORT: '0', DATA_DIR: dataDir, MASTER_KEY: 'd'.repeat(64), RATE_LIMIT_PER_MINUTE: '0' });
  const svc = await startService(config, pino({ level: 'warn' }, sink));
  t.teardown(() => svc.close());
  t.match(logged, /what an earlier version stored with PGlite in DATA_DIR\/pglite is not carried over/);
  t.ok(existsSync(join(dataDir, 'postgres', 'PG_VERSION')), 'the PostgreSQL cluster is made beside it');
  t.ok(existsSync(join(dataDir, 'pglite')), 'the old directory is left as it was');
});
