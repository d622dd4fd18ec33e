import { type ChildProcess, fork } from 'node:child_process';
import { ensureServeBundle, SERVE, SERVE_BUNDLE } from '../../bundle.mjs';
import { repoRoot } from './machine.ts';
import { stopChild } from './proc.ts';

export interface Ours {
  url: string;
  port: number;
  pid: number;
  child: ChildProcess;
  /** Calls `<module>#<export>` (a module serve.ts lists, e.g. `ops/memory`) inside the target. */
  call<T>(op: string, args?: unknown): Promise<T>;
  stop(): Promise<void>;
}

let serveBuilt: Promise<boolean> | undefined;

/** serve.ts's build (bench/bundle.mjs) when it is or can be made current, else the source. */
async function serveEntry(): Promise<{ module: string; execArgv: string[] }> {
  serveBuilt ??= ensureServeBundle();
  return (await serveBuilt) ? { module: SERVE_BUNDLE, execArgv: [] } : { module: SERVE, execArgv: ['--import', 'tsx'] };
}

/**
 * Our service in a process of its own (bench/src/serve.ts), so the bench's clients and the
 * server do not share an event loop and the server's memory can be read from /proc.
 * `config` overrides the embedded defaults (REDIS_URL, EDGE, ...). `nodeArgs` go to node
 * (`--cpu-prof`, `--max-old-space-size`).
 */
export async function startOurs(config: Record<string, string> = {}, nodeArgs: string[] = []): Promise<Ours> {
  const entry = await serveEntry();
  const child = fork(entry.module, [], {
    cwd: repoRoot,
    execArgv: [...entry.execArgv, ...nodeArgs],
    env: { ...process.env, BENCH_CONFIG: JSON.stringify(config) },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  let next = 1;
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  const ready = new Promise<{ url: string; port: number }>((resolve, reject) => {
    child.on(
      'message',
      (m: { type?: string; id?: number; result?: unknown; error?: string; url?: string; port?: number }) => {
        if (m.type === 'ready') resolve({ url: m.url as string, port: m.port as number });
        else if (m.id !== undefined) {
          const p = pending.get(m.id);
          pending.delete(m.id);
          if (m.error) p?.reject(new Error(m.error));
          else p?.resolve(m.result);
        }
      },
    );
    child.once('exit', (code, signal) => {
      const err = new Error(`our service exited (${code ?? signal})`);
      reject(err);
      for (const p of pending.values()) p.reject(err);
      pending.clear();
    });
  });
  const { url, port } = await ready;
  return {
    url,
    port,
    pid: child.pid as number,
    child,
    call: <T>(op: string, args?: unknown) =>
      new Promise<T>((resolve, reject) => {
        const id = next++;
        pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
        child.send({ id, op, args });
      }),
    stop: () => stopChild(child, 15_000),
  };
}
