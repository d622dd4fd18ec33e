import { benchModule } from '../lib/child-module.ts';
import { rssOf, startProcess } from '../lib/proc.ts';

export interface UwsFloor {
  port: number;
  pid: number;
  rss(): number;
  stop(): Promise<void>;
}

/**
 * The bare uWebSockets.js SSE server (uws-sse-server.ts) in a process of its own, on a free
 * loopback port; the same `/sub/<channel>` and `/pub/<channel>` paths as Nchan.
 */
export async function startUwsFloor(nodeArgs: string[] = []): Promise<UwsFloor> {
  const server = benchModule(new URL('./uws-sse-server.ts', import.meta.url));
  const started = await startProcess(process.execPath, [...nodeArgs, ...server.execArgv, server.script], {
    ready: /listening on (\d+)/,
    name: 'uWebSockets.js floor',
  });
  const pid = started.child.pid as number;
  return { port: Number(started.ready[1]), pid, rss: () => rssOf(pid), stop: started.stop };
}
