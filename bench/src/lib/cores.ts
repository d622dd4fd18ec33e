import { execFileSync } from 'node:child_process';
import { treeOf } from './proc.ts';

/**
 * How a scenario split this machine's cores between the servers it measures (with the stores
 * and publishers counted on their side) and the load clients, so that a server's CPU per
 * delivery is not its share of cores the clients also fight for. `pinned` is false where
 * `taskset` is missing or fewer than two cores are allowed: then everything shares them.
 */
export interface CoreSplit {
  pinned: boolean;
  /** CPU lists as `taskset -c` takes them ("0", "1-3"); empty when not pinned. */
  servers: string;
  clients: string;
  /** One sentence for the report. */
  description: string;
}

/** The CPUs this process may run on, from `taskset -c -p` ("0,1" or "0-3,6"). */
function allowedCpus(): number[] | undefined {
  try {
    const out = execFileSync('taskset', ['-c', '-p', String(process.pid)], { stdio: ['ignore', 'pipe', 'pipe'] })
      .toString()
      .trim();
    const list = out.slice(out.lastIndexOf(':') + 1).trim();
    const cpus: number[] = [];
    for (const part of list.split(',')) {
      const [a, b] = part.split('-').map(Number) as [number, number | undefined];
      if (!Number.isInteger(a)) return undefined;
      for (let c = a; c <= (b ?? a); c++) cpus.push(c);
    }
    return cpus;
  } catch {
    return undefined;
  }
}

/**
 * The first half of the allowed CPUs (at least one) for the servers, the rest for the load
 * clients; on two cores, one each.
 */
export function splitCores(): CoreSplit {
  const cpus = allowedCpus();
  if (!cpus) {
    return {
      pinned: false,
      servers: '',
      clients: '',
      description: 'not pinned: `taskset` is not available here, so servers and load clients share every core',
    };
  }
  if (cpus.length < 2) {
    return {
      pinned: false,
      servers: '',
      clients: '',
      description: `not pinned: only CPU ${cpus.join(',')} is allowed, so servers and load clients share it`,
    };
  }
  const half = Math.max(1, Math.floor(cpus.length / 2));
  const servers = cpus.slice(0, half).join(',');
  const clients = cpus.slice(half).join(',');
  return {
    pinned: true,
    servers,
    clients,
    description: `pinned with taskset: the server side (server, its Redis and Postgres or its publisher) on CPU ${servers}, the load clients (watcher processes) on CPU ${clients}, of ${cpus.length} allowed`,
  };
}

/**
 * Pins every thread of `pid` and of its descendants to `cpus` (`taskset -a -p -c`). Threads
 * and processes they start later inherit it. A no-op when the split is not pinned; a process
 * gone meanwhile is skipped.
 */
export function pinTree(pid: number, cpus: string): void {
  if (!cpus) return;
  for (const p of treeOf(pid)) {
    try {
      execFileSync('taskset', ['-a', '-p', '-c', cpus, String(p)], { stdio: 'ignore' });
    } catch {
      // exited meanwhile
    }
  }
}
