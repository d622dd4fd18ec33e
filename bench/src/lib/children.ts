/**
 * The child processes a load-client fleet spreads its sockets over (clients/fleet.ts for runner
 * and echo WebSockets, sse/fleet.ts for SSE watchers). A process may hold 20,000 open files
 * here, and one loopback source address has about 28,000 ephemeral ports to one server port,
 * so a fleet splits its sockets over processes and the processes over source addresses. The
 * fleets keep their own message protocols; this module forks, places, meters and stops.
 */
import { type ChildProcess, fork, type Serializable } from 'node:child_process';
import { benchModule } from './child-module.ts';
import { repoRoot } from './machine.ts';
import { cpuSecondsOf, stopChild } from './proc.ts';

/** One child process and its share of the fleet's sockets: `count` of them from index `first`. */
export interface LoadClient {
  child: ChildProcess;
  first: number;
  count: number;
  /** The loopback source address its sockets bind to (127.0.x.y, never 127.0.0.1). */
  localAddress: string;
}

export interface LoadClients {
  /** In socket order: the shares are consecutive and together cover every socket once. */
  clients: LoadClient[];
  /** CPU seconds the children used so far, an exited child counting with its last reading. */
  cpuSeconds(): number;
  /**
   * Sends `goodbye` (the fleet's own "close your sockets and exit") to every child still
   * connected, then stops them all; resolves once every one has exited.
   */
  close(goodbye: Serializable): Promise<void>;
}

/**
 * Source addresses are never reused within one bench process: the sockets of a closed fleet
 * linger in TIME_WAIT on theirs, and binding next to thousands of those makes the kernel's
 * search for a free port slow.
 */
let nextAddress = 0;
function freshAddress(): string {
  const a = nextAddress++;
  return `127.0.${1 + Math.floor(a / 250)}.${2 + (a % 250)}`;
}

/**
 * Forks `module` (a child speaking its fleet's protocol over IPC; benchModule says how it runs)
 * enough times that none holds more than `perProcess` of `sockets` sockets, and at least
 * `processes` times. The sockets are shared out evenly in order; consecutive children share
 * a fresh source address while together they hold at most `perAddress` sockets.
 */
export function forkLoadClients(
  module: URL,
  sockets: number,
  limits: { perProcess: number; perAddress: number; processes?: number },
): LoadClients {
  const n = Math.max(limits.processes ?? 1, Math.ceil(sockets / limits.perProcess));
  const entry = benchModule(module);
  const clients: LoadClient[] = [];
  let first = 0;
  let localAddress = freshAddress();
  let onAddress = 0;
  for (let i = 0; i < n; i++) {
    const count = Math.floor(sockets / n) + (i < sockets % n ? 1 : 0);
    if (onAddress > 0 && onAddress + count > limits.perAddress) {
      localAddress = freshAddress();
      onAddress = 0;
    }
    onAddress += count;
    const child = fork(entry.script, [], {
      cwd: repoRoot,
      execArgv: entry.execArgv,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    clients.push({ child, first, count, localAddress });
    first += count;
  }
  // /proc forgets a process once it has exited: read every second so a gone child keeps its
  // last reading, and again whenever asked.
  const cpu = clients.map(() => 0);
  const sampleCpu = () =>
    clients.forEach((c, i) => {
      try {
        cpu[i] = cpuSecondsOf(c.child.pid as number);
      } catch {
        // gone: keep its last reading
      }
    });
  const sampler = setInterval(sampleCpu, 1000);
  sampler.unref();
  return {
    clients,
    cpuSeconds() {
      sampleCpu();
      return cpu.reduce((a, b) => a + b, 0);
    },
    async close(goodbye) {
      clearInterval(sampler);
      sampleCpu();
      for (const { child } of clients) if (child.connected) child.send(goodbye);
      await Promise.all(clients.map(({ child }) => stopChild(child)));
    },
  };
}
