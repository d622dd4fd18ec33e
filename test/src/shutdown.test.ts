/**
 * Stopping `npm start`: SIGTERM stops the service whichever process of it receives it (npm's,
 * or node's), connected runners are told `going_away` (1001) so they reconnect elsewhere, and
 * the port and the data directory are free afterwards.
 */
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { collectOutput } from './child-output.ts';
import { PASSWORD, signUp, startTestService, tokenFrom, uniqueEmail, waitForMail } from './harness.ts';
import { startRunnerProcess } from './runner-process.ts';
import { until } from './until.ts';

const root = join(import.meta.dirname, '..', '..');

/** Whether a process is gone (a zombie nobody reaped counts as gone: it runs nothing). */
function gone(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return /^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

/** Every process below `pid`, read from /proc. */
function descendants(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {} // exited meanwhile
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const c of children.get(p) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

function argv(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(port, '127.0.0.1');
    sock.once('connect', () => {
      sock.destroy();
      resolve(true);
    });
    sock.once('error', () => resolve(false));
  });
}

/** `npm start` on embedded storage in a temporary DATA_DIR; resolves once it listens. */
async function npmStart(t: Test) {
  const dataDir = await mkdtemp(join(tmpdir(), 'svc-test-shutdown-'));
  t.teardown(() => rm(dataDir, { recursive: true, force: true }));
  const npm = spawn('npm', ['start', '--silent'], {
    cwd: root,
    env: {
      ...process.env,
      PORT: '0',
      DATA_DIR: dataDir,
      DATABASE_URL: '',
      LOG_LEVEL: 'warn',
      SHUTDOWN_GRACE_MS: '2000',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const { both: output } = collectOutput(npm);
  const url = await until('the banner', () => /listening on (\S+)/.exec(output())?.[1], 60_000);
  // `node gateway/start.mjs`, not a shell that runs it.
  const node = descendants(npm.pid as number).find((p) => argv(p)[1] === 'gateway/start.mjs') as number;
  t.teardown(() => {
    for (const pid of [node, npm.pid as number]) if (!gone(pid)) process.kill(pid, 'SIGKILL');
  });
  return { npm, node, url, port: Number(new URL(url).port), dataDir, output };
}

/** An account on the service at `url`, signed up through its API: its key. */
async function signUpAt(url: string, dataDir: string): Promise<string> {
  const post = async (path: string, body: unknown, key?: string) =>
    (
      await fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body: JSON.stringify(body),
      })
    ).json() as Promise<Record<string, string>>;
  const email = uniqueEmail('shutdown');
  await post('/api/auth/register', { email, password: PASSWORD });
  await post('/api/auth/verify', { token: tokenFrom(await waitForMail(join(dataDir, 'mail'), email, /verify/i)) });
  return (await post('/api/auth/token', { email, password: PASSWORD })).key as string;
}

t.test('SIGTERM to the npm start process stops node; a connected runner is told going_away', async (t) => {
  const svc = await npmStart(t);
  t.ok(svc.node, 'node runs below npm');
  const key = await signUpAt(svc.url, svc.dataDir);
  const created = await fetch(`${svc.url}/api/runners`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ name: 'box' }),
  });
  const { token } = (await created.json()) as { token: string };
  const runner = await startRunnerProcess(t, svc.url, token);

  process.kill(svc.npm.pid as number, 'SIGTERM');
  await until('node to exit', () => gone(svc.node), 30_000);
  t.pass('the node process exited');
  t.equal(await accepts(svc.port), false, 'nothing listens on the port');
  t.notOk(existsSync(join(svc.dataDir, 'svc.lock')), 'DATA_DIR is released');
  await until('the runner to report the close', () => /connection lost \(1001/.test(runner.output), 10_000).catch(
    () => undefined,
  );
  t.match(runner.output, /connection lost \(1001: the service is shutting down\)/, 'the runner heard 1001 going_away');
});

t.test('SIGTERM to the node process stops it too', async (t) => {
  const svc = await npmStart(t);
  process.kill(svc.node, 'SIGTERM');
  await until('node to exit', () => gone(svc.node), 30_000);
  t.equal(await accepts(svc.port), false, 'nothing listens on the port');
  await until('npm to exit', () => gone(svc.npm.pid as number), 30_000);
  t.pass('npm exits with it');
});

for (const edge of [true, false]) {
  t.test(`a service closing tells its runners going_away (EDGE=${edge})`, async (t) => {
    const svc = await startTestService(t, { backend: 'embedded', env: { EDGE: String(edge) } });
    const me = await signUp(svc);
    const created = await svc.http.post('/api/runners', { token: me.key, body: { name: 'box' } });
    const runner = await startRunnerProcess(t, svc.url, created.body.token as string);
    await svc.close();
    await until('the runner to report the close', () => /connection lost/.test(runner.output), 10_000).catch(
      () => undefined,
    );
    t.match(runner.output, /connection lost \(1001: the service is shutting down\)/);
  });
}
