/**
 * A throwaway Redis Cluster for one test file: masters only, each a `redis-server
 * --cluster-enabled yes` on free ports in its own temp dir, configured like the single server
 * test/run.mjs starts (no persistence, noeviction), joined with `redis-cli --cluster create`.
 */
import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { settlesWithin } from './until.ts';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Why a cluster cannot be started here, or undefined when it can. */
export function clusterUnavailable(): string | undefined {
  for (const cmd of ['redis-server', 'redis-cli']) {
    try {
      execFileSync(cmd, ['--version'], { stdio: 'ignore' });
    } catch {
      return `${cmd} is not installed: the Redis Cluster tests need redis-server and redis-cli 7`;
    }
  }
  return undefined;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => {
      const address = srv.address();
      srv.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
    srv.on('error', reject);
  });
}

export interface ClusterNodeProcess {
  port: number;
  /** The cluster bus port (given explicitly: port + 10000 may be taken or beyond 65535). */
  busPort: number;
  dir: string;
  child: ChildProcess;
}

export interface TestRedisCluster {
  nodes: ClusterNodeProcess[];
  /** Every node as a seed: the value of REDIS_URL with REDIS_CLUSTER=true. */
  url: string;
  cli(port: number, ...args: string[]): Promise<string>;
  /** Kills one node and starts it again on the same port and directory (it keeps its slots). */
  restart(port: number): Promise<void>;
  stop(): Promise<void>;
}

/** Starts `masters` nodes, creates the cluster, and resolves once every node reports it ok. */
export async function startRedisCluster(masters = 3): Promise<TestRedisCluster> {
  const nodes: ClusterNodeProcess[] = [];
  const cli = async (port: number, ...args: string[]) =>
    (await run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args])).stdout;
  const stop = async () => {
    await Promise.all(
      nodes.map(async (n) => {
        if (n.child.exitCode === null && n.child.signalCode === null) {
          const exited = new Promise((r) => n.child.once('exit', r));
          n.child.kill('SIGTERM');
          await settlesWithin(exited, 3000);
          if (n.child.exitCode === null && n.child.signalCode === null) n.child.kill('SIGKILL');
        }
        rmSync(n.dir, { recursive: true, force: true });
      }),
    );
  };
  const spawnNode = (port: number, busPort: number, dir: string) =>
    spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--cluster-enabled',
        'yes',
        '--cluster-port',
        String(busPort),
        '--cluster-config-file',
        'nodes.conf',
        '--cluster-node-timeout',
        '5000',
        '--dir',
        dir,
        '--save',
        '',
        '--appendonly',
        'no',
        '--maxmemory-policy',
        'noeviction',
      ],
      { stdio: 'ignore' },
    );
  const answers = async (n: ClusterNodeProcess) => {
    for (let i = 0; ; i++) {
      if (n.child.exitCode !== null) throw new Error(`redis-server on port ${n.port} exited (${n.child.exitCode})`);
      try {
        if ((await cli(n.port, 'ping')).trim() === 'PONG') return;
      } catch {}
      if (i > 100) throw new Error(`redis-server on port ${n.port} did not answer`);
      await sleep(50);
    }
  };
  // Every node must have met the others over the bus and agree the key space is covered
  // before it answers for all of it.
  const agreed = async () => {
    for (let i = 0; ; i++) {
      const infos = await Promise.all(nodes.map((n) => cli(n.port, 'cluster', 'info')));
      const ok = infos.every(
        (info) => /cluster_state:ok/.test(info) && new RegExp(`cluster_known_nodes:${masters}\\b`).test(info),
      );
      if (ok) return;
      if (i > 200) throw new Error(`the Redis Cluster did not reach cluster_state:ok:\n${infos.join('\n')}`);
      await sleep(50);
    }
  };
  const restart = async (port: number) => {
    const n = nodes.find((x) => x.port === port);
    if (!n) throw new Error(`no node on port ${port}`);
    const exited = new Promise((r) => n.child.once('exit', r));
    n.child.kill('SIGKILL');
    await exited;
    n.child = spawnNode(n.port, n.busPort, n.dir);
    await answers(n);
    await agreed();
  };
  try {
    // A free port may be taken by the time the node binds it (test files run in parallel,
    // and a node not yet up leaves its ports free for the next pick): a node that exits on
    // start is tried again on other ports.
    const taken = new Set<number>();
    const pick = async () => {
      let port = await freePort();
      while (taken.has(port)) port = await freePort();
      taken.add(port);
      return port;
    };
    for (let i = 0; i < masters; i++) {
      for (let attempt = 1; ; attempt++) {
        const dir = mkdtempSync(join(tmpdir(), 'svc-test-redis-cluster-'));
        const port = await pick();
        const busPort = await pick();
        const n = { port, busPort, dir, child: spawnNode(port, busPort, dir) };
        try {
          await answers(n);
          nodes.push(n);
          break;
        } catch (err) {
          if (n.child.exitCode === null || attempt === 5) {
            nodes.push(n); // stopped below
            throw err;
          }
          rmSync(dir, { recursive: true, force: true });
        }
      }
    }
    await run('redis-cli', [
      '--cluster',
      'create',
      ...nodes.map((n) => `127.0.0.1:${n.port}`),
      '--cluster-replicas',
      '0',
      '--cluster-yes',
    ]);
    await agreed();
  } catch (err) {
    await stop();
    throw err;
  }
  return { nodes, url: nodes.map((n) => `redis://127.0.0.1:${n.port}`).join(','), cli, restart, stop };
}
