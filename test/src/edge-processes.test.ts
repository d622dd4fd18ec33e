import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, loadConfig } from '@svc/gateway';
import t, { type Test } from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { createDatabase, signUp, startTestService, type TestService } from './harness.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';
import { until } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const root = join(import.meta.dirname, '..', '..');

/** Whether a process is gone (a zombie nobody reaped counts as gone: it runs nothing). */
function gone(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return true;
  }
  try {
    return /^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

/**
 * Which process holds each accepted connection on `port`, read from the kernel, not from the
 * service: socket inodes from /proc/<pid>/fd, matched to /proc/net/tcp entries whose local
 * port is `port`. The key is the client's port, so a test can name the process of each socket.
 */
function connectionOwners(port: number, pids: readonly number[]): Map<number, number> {
  const inodes = new Map<string, number>();
  for (const pid of pids) {
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      try {
        const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
        if (m) inodes.set(m[1] as string, pid);
      } catch {} // closed meanwhile
    }
  }
  const owners = new Map<number, number>();
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10) continue;
      const localPort = Number.parseInt((f[1] as string).split(':')[1] as string, 16);
      const remotePort = Number.parseInt((f[2] as string).split(':')[1] as string, 16);
      const established = f[3] === '01';
      const pid = inodes.get(f[9] as string);
      if (localPort === port && established && pid !== undefined) owners.set(remotePort, pid);
    }
  }
  return owners;
}

const allPids = (svc: TestService) => [process.pid, ...(svc.edgeProcesses?.pids() ?? [])];

type Watcher = ReturnType<typeof rawGet> & { clientPort: number };

/** Opens `n` SSE watchers of a conversation and waits until the kernel shows whose each one is. */
async function watchers(svc: TestService, path: string, key: string, n: number) {
  const list: Watcher[] = [];
  for (let i = 0; i < n; i++) {
    const w = rawGet(svc, path, { authorization: `Bearer ${key}` });
    await new Promise((r) => w.sock.once('connect', r));
    list.push(Object.assign(w, { clientPort: w.sock.localPort as number }));
  }
  await until('every stream to answer', () => list.every((w) => w.text().includes('\r\n\r\n')));
  const owners = await until('every connection to be accounted for', () => {
    const o = connectionOwners(svc.port, allPids(svc));
    return list.every((w) => o.has(w.clientPort)) && o;
  });
  const ownerOf = (w: Watcher) => owners.get(w.clientPort) as number;
  return {
    list,
    ownerOf,
    close: () => {
      for (const x of list) x.sock.destroy();
    },
  };
}

/** GET /api/health on a connection of its own, so each request is accepted anew. */
function health(url: string): Promise<number> {
  return new Promise((resolve, reject) => {
    get(`${url}/api/health`, { agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode as number));
    }).on('error', reject);
  });
}

t.test('loadConfig refuses EDGE_PROCESSES > 1 where processes could not share state or the port', async (t) => {
  const base = { DATABASE_URL: 'postgres://svc@127.0.0.1/x', REDIS_URL: 'redis://127.0.0.1:6379' };
  const refusal = (env: Record<string, string>) => {
    try {
      loadConfig(env);
    } catch (err) {
      t.ok(err instanceof ConfigError, 'a ConfigError');
      return (err as Error).message;
    }
    return 'accepted';
  };
  t.match(refusal({ ...base, EDGE_PROCESSES: '2', REDIS_URL: '' }), /REDIS_URL: required .*EDGE_PROCESSES > 1/);
  t.match(
    refusal({ ...base, EDGE_PROCESSES: '2', DATABASE_URL: '' }),
    /DATABASE_URL: must name a Postgres server \(the embedded database serves the one process that holds DATA_DIR\).*EDGE_PROCESSES > 1/,
  );
  t.match(refusal({ ...base, EDGE_PROCESSES: '2', DATABASE_URL: 'memory' }), /DATABASE_URL: must name a Postgres/);
  t.match(refusal({ ...base, EDGE_PROCESSES: '2', EDGE: 'false' }), /EDGE: must be true .*Node 20/);
  t.match(refusal({ ...base, EDGE_PROCESSES: '0' }), /EDGE_PROCESSES:/);
  t.equal(loadConfig({ ...base, EDGE_PROCESSES: '4' }).EDGE_PROCESSES, 4);
  t.equal(loadConfig({}).EDGE_PROCESSES, 1, 'one process by default, embedded storage allowed');
});

t.test(
  'EDGE_PROCESSES=3: three processes serve one port on Redis and Postgres',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres' },
  async (t) => {
    const svc = await startTestService(t, {
      backend: 'postgres+redis',
      env: { EDGE_PROCESSES: '3', SSE_IDLE_CLOSE_MS: '0' },
    });
    const children = svc.edgeProcesses?.pids() ?? [];
    t.equal(children.length, 2, 'two children beside this process');
    const me = await signUp(svc);
    const conv = await createConversationRecord(
      svc.db.sql,
      { accountId: me.accountId, actor: 'api', ip: null },
      { agentId: 'agt_x' },
    );
    const stream = `/api/conversations/${conv.id}/stream?wait=true`;
    let seq = 0;
    const append = (data: string) =>
      svc.appendEvents({
        tenant: me.accountId,
        producer: 'runner-a',
        seq: ++seq,
        events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data }],
      });

    await t.test('connections land on every process, and an event reaches watchers on each', async (t) => {
      const w = await watchers(svc, stream, me.key, 45);
      t.teardown(w.close);
      const held = new Set(w.list.map(w.ownerOf));
      t.same([...held].sort(), allPids(svc).sort(), 'each of the three processes holds watchers');
      await sleep(300);
      await append('hello, every process');
      await until('every watcher to receive the event', () =>
        w.list.every((x) => frames(x.text()).some((f) => parseFrame(f).data?.includes('hello, every process'))),
      );
      t.pass('all 45 watchers, on three processes, received it');
    });

    await t.test('a killed child is restarted, and the port answers throughout', async (t) => {
      const victim = children[0] as number;
      process.kill(victim, 'SIGKILL');
      await until('the supervisor to notice', () => !svc.edgeProcesses?.pids().includes(victim));
      const during = await Promise.all(Array.from({ length: 10 }, () => health(svc.url)));
      t.same(during, Array(10).fill(200), 'the other processes answer meanwhile');
      const after = await until('a new child', () => {
        const pids = svc.edgeProcesses?.pids() ?? [];
        return pids.length === 2 && !pids.includes(victim) && pids;
      });
      t.equal(after.filter((p) => !children.includes(p)).length, 1, 'one new process');
      const w = await watchers(svc, stream, me.key, 45);
      t.teardown(w.close);
      t.same([...new Set(w.list.map(w.ownerOf))].sort(), allPids(svc).sort(), 'the new process takes connections');
      await sleep(300);
      await append('after the restart');
      await until('every watcher to receive the event', () =>
        w.list.every((x) => frames(x.text()).some((f) => parseFrame(f).data?.includes('after the restart'))),
      );
      t.pass('and delivers live events');
    });

    await t.test('close() stops every child and frees the port', async (t) => {
      const pids = svc.edgeProcesses?.pids() ?? [];
      t.equal(pids.length, 2);
      await svc.close();
      t.ok(
        pids.every((p) => gone(p)),
        'no child left running',
      );
      await t.rejects(health(svc.url), 'nothing listens on the port');
    });
  },
);

/** `npm start` with EDGE_PROCESSES=2 in a process of its own; its banner names both pids. */
async function startPrimary(t: Test) {
  const dataDir = await mkdtemp(join(tmpdir(), 'svc-test-edgeproc-'));
  t.teardown(() => rm(dataDir, { recursive: true, force: true }));
  const primary: ChildProcess = spawn(process.execPath, ['gateway/start.mjs'], {
    cwd: root,
    env: {
      ...process.env,
      PORT: '0',
      EDGE_PROCESSES: '2',
      DATABASE_URL: await createDatabase(t),
      REDIS_URL: process.env.TEST_REDIS_URL,
      REDIS_KEY_PREFIX: `t${randomBytes(4).toString('hex')}:`,
      MASTER_KEY: randomBytes(32).toString('hex'),
      DATA_DIR: dataDir,
      LOG_LEVEL: 'silent',
      SHUTDOWN_GRACE_MS: '1000',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = new Promise<number | null>((resolve) => primary.once('exit', (code) => resolve(code)));
  let out = '';
  primary.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  primary.stderr?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  let banner: RegExpExecArray;
  try {
    banner = await until('the banner', () => /edge processes: 2 .*pids (\d+), (\d+)/.exec(out), 60_000);
  } finally {
    t.teardown(() => {
      if (primary.exitCode === null) primary.kill('SIGKILL');
    });
  }
  return {
    primary,
    exited,
    url: /listening on (\S+)/.exec(out)?.[1] as string,
    bannerPids: [Number(banner[1]), Number(banner[2])],
  };
}

t.test(
  'npm start with EDGE_PROCESSES=2',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres' },
  async (t) => {
    await t.test('SIGTERM to the first process stops both', async (t) => {
      const { primary, exited, url, bannerPids } = await startPrimary(t);
      t.equal(bannerPids[0], primary.pid, 'the banner names the first process, then the other');
      t.equal(await health(url), 200);
      primary.kill('SIGTERM');
      t.equal(await exited, 0, 'the first process exits cleanly');
      t.ok(gone(bannerPids[1] as number), 'having stopped the other');
    });

    await t.test('a copy exits when the first process is SIGKILLed', async (t) => {
      const { primary, url, bannerPids } = await startPrimary(t);
      t.equal(await health(url), 200);
      primary.kill('SIGKILL');
      await until('the copy to exit', () => gone(bannerPids[1] as number));
      t.pass('it noticed its IPC channel close');
    });
  },
);
