/**
 * One instance per data directory and per port: a second `npm start` on either is refused
 * with a message naming what holds it, instead of splitting the traffic (SO_REUSEPORT) or the
 * embedded database's writes between two processes.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { createLogger, EXIT_IN_USE, InUseError, loadConfig, startService } from '@svc/gateway';
import pino from 'pino';
import t, { type Test } from 'tap';
import { startEdge } from '../../gateway/src/edge/edge.ts';
import { createForwarder } from '../../gateway/src/edge/forward.ts';
import { freePort } from '../../gateway/src/processes/supervisor.ts';
import { collectOutput } from './child-output.ts';
import { createDatabase, startTestService } from './harness.ts';
import { zombie } from './npm-start.ts';

const root = join(import.meta.dirname, '..', '..');
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function tempDir(t: Test): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'svc-test-instance-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

export interface Started {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
  /** Resolves with the service's URL once the banner is out; rejects when it exits first. */
  listening: Promise<string>;
}

/** `gateway/start.mjs` (what `npm start` runs) in a process of its own. */
function startProcess(t: Test, env: Record<string, string>): Started {
  const child = spawn(process.execPath, ['gateway/start.mjs'], {
    cwd: root,
    env: { ...process.env, LOG_LEVEL: 'warn', MASTER_KEY: randomBytes(32).toString('hex'), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  const { both: output, exited } = collectOutput(child);
  const listening = new Promise<string>((resolve, reject) => {
    child.stdout?.on('data', () => {
      const m = /listening on (\S+)/.exec(output());
      if (m) resolve(m[1] as string);
    });
    void exited.then((code) => reject(new Error(`exited with ${code} before listening:\n${output()}`)));
  });
  listening.catch(() => {});
  return { child, output, exited, listening };
}

t.test('a second npm start on one DATA_DIR is refused, naming the pid that holds it', async (t) => {
  const dataDir = await tempDir(t);
  const first = startProcess(t, { PORT: '0', DATA_DIR: dataDir, DATABASE_URL: '' });
  await first.listening;
  t.equal((await readFile(join(dataDir, 'svc.lock'), 'utf8')).trim(), String(first.child.pid), 'the lock names it');

  const second = startProcess(t, { PORT: '0', DATA_DIR: dataDir, DATABASE_URL: '' });
  t.equal(await second.exited, EXIT_IN_USE, 'exit 75');
  t.match(second.output(), `DATA_DIR ${dataDir} is in use by another svc instance (pid ${first.child.pid}`);
  t.notMatch(second.output(), /listening/);

  first.child.kill('SIGTERM');
  t.equal(await first.exited, 0);
  t.notOk(existsSync(join(dataDir, 'svc.lock')), 'a clean stop removes the lock');
});

t.test('a lock left by a process that is gone is taken over, and the takeover is logged', async (t) => {
  const dataDir = await tempDir(t);
  const dead = spawn(process.execPath, ['-e', '']);
  await new Promise((r) => dead.once('exit', r));
  await writeFile(join(dataDir, 'svc.lock'), `${dead.pid}\n`);
  let logged = '';
  const sink = new Writable({
    write(chunk, _enc, done) {
      logged += chunk.toString();
      done();
    },
  });
  const config = loadConfig({ PORT: '0', DATA_DIR: dataDir, MASTER_KEY: 'c'.repeat(64), RATE_LIMIT_PER_MINUTE: '0' });
  const svc = await startService(config, pino({ level: 'warn' }, sink));
  t.teardown(() => svc.close());
  t.match(logged, `taking over DATA_DIR's lock from pid ${dead.pid}, which is gone`);
  t.equal(await readFile(join(dataDir, 'svc.lock'), 'utf8'), `${process.pid}\n`);
  // And the lock now keeps out another start, even one in this same process.
  await t.rejects(
    startService(config, pino({ level: 'silent' })),
    new InUseError(
      `DATA_DIR ${dataDir} is in use by another svc instance (pid ${process.pid}; lock file ${join(dataDir, 'svc.lock')}).\n` +
        'Stop that instance first, or give this one its own DATA_DIR.',
    ),
  );
  t.equal(await readFile(join(dataDir, 'svc.lock'), 'utf8'), `${process.pid}\n`, 'the refused start left it alone');
});

t.test('a lock naming a zombie (a killed instance init has not collected yet) is taken over', async (t) => {
  const dataDir = await tempDir(t);
  const pid = await zombie(t);
  await writeFile(join(dataDir, 'svc.lock'), `${pid}\n`);
  const config = loadConfig({ PORT: '0', DATA_DIR: dataDir, MASTER_KEY: 'c'.repeat(64), RATE_LIMIT_PER_MINUTE: '0' });
  const svc = await startService(config, pino({ level: 'silent' }));
  t.teardown(() => svc.close());
  t.equal(await readFile(join(dataDir, 'svc.lock'), 'utf8'), `${process.pid}\n`, "the lock is this process's now");
});

t.test('a second npm start on a port an instance listens on is refused, naming its pid', async (t) => {
  const first = await startTestService(t, { backend: 'embedded' });
  const second = startProcess(t, { PORT: String(first.port), DATA_DIR: await tempDir(t), DATABASE_URL: 'memory' });
  t.equal(await second.exited, EXIT_IN_USE, 'exit 75');
  t.match(second.output(), `port ${first.port} on 127.0.0.1 is in use by pid ${process.pid}`);
  t.equal((await fetch(`${first.url}/api/health`)).status, 200, 'the first still serves');
});

t.test('EDGE=false and the edge refuse each other a port', async (t) => {
  for (const [firstEdge, secondEdge] of [
    ['true', 'false'],
    ['false', 'true'],
    ['false', 'false'],
  ]) {
    const first = await startTestService(t, { backend: 'embedded', env: { EDGE: firstEdge as string } });
    const config = loadConfig({
      PORT: String(first.port),
      DATABASE_URL: 'memory',
      DATA_DIR: await tempDir(t),
      MASTER_KEY: 'd'.repeat(64),
      EDGE: secondEdge,
    });
    const refused = await startService(config, pino({ level: 'silent' })).catch((e: Error) => e);
    t.type(refused, InUseError, `EDGE=${secondEdge} after EDGE=${firstEdge} is refused`);
    t.match((refused as Error).message, `port ${first.port} on 127.0.0.1 is in use by another process`);
    await first.close();
  }
});

t.test(
  'an EDGE_PROCESSES group refuses a port another instance holds',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres' },
  async (t) => {
    const first = await startTestService(t, { backend: 'postgres+redis' });
    const config = loadConfig({
      PORT: String(first.port),
      EDGE_PROCESSES: '2',
      DATABASE_URL: await createDatabase(t),
      REDIS_URL: process.env.TEST_REDIS_URL,
      REDIS_KEY_PREFIX: `t${randomBytes(4).toString('hex')}:`,
      DATA_DIR: await tempDir(t),
      MASTER_KEY: 'e'.repeat(64),
    });
    const refused = await startService(config, pino({ level: 'silent' })).catch((e: Error) => e);
    t.type(refused, InUseError);
    t.match((refused as Error).message, `port ${first.port} on 127.0.0.1 is in use`);
    await sleep(200);
    t.equal((await fetch(`${first.url}/api/health`)).status, 200, 'the first still serves');
  },
);

t.test('the edge binds its port exclusively: a second edge cannot join it, even past the start check', async (t) => {
  const log = createLogger('silent');
  const forwarder = createForwarder((_req, res) => res.end(), log);
  const edge = (sharing?: 'group-member') =>
    startEdge({ host: '127.0.0.1', port, sharing, limiter: undefined, rateLimitExempt: [], forwarder, log });
  // A port chosen first: a socket bound to port 0 could not be shared anyway.
  const port = await freePort('127.0.0.1');
  const first = await edge();
  t.teardown(() => first.close(0));
  const alone = await edge().catch((e: Error) => e);
  t.type(alone, InUseError, 'another lone edge is refused');
  const member = await edge('group-member').catch((e: Error) => e);
  t.type(member, Error, 'nor can a shareable bind join it');
  if (!(alone instanceof Error)) await alone.close(0);
  if (!(member instanceof Error)) await member.close(0);
});
