import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { repoRoot } from './machine.ts';
import { cpuSecondsOf } from './proc.ts';

export interface LoadResult {
  requestsPerSecond: number;
  /** Responses received over the whole run. */
  requests: number;
  p50: number;
  p99: number;
  errors: number;
  non2xx: number;
  /** CPU seconds the autocannon process used. */
  clientCpuSeconds: number;
}

/** autocannon in its own process, so the load generator does not share anyone's event loop. */
export async function autocannon(opts: {
  url: string;
  connections: number;
  seconds: number;
  method?: 'GET' | 'POST';
  headers?: Record<string, string>;
  body?: string;
  workers?: number;
  /** Replaces `[<id>]` in the body with a fresh id per request (names that must be unique). */
  idReplacement?: boolean;
}): Promise<LoadResult> {
  const args = [
    join(repoRoot, 'node_modules/autocannon/autocannon.js'),
    '-c',
    String(opts.connections),
    '-d',
    String(opts.seconds),
    '-j',
    '-m',
    opts.method ?? 'GET',
  ];
  if (opts.workers) args.push('-w', String(opts.workers));
  if (opts.idReplacement) args.push('-I');
  for (const [k, v] of Object.entries(opts.headers ?? {})) args.push('-H', `${k}=${v}`);
  if (opts.body) args.push('-b', opts.body);
  args.push(opts.url);
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  let cpu = 0;
  const sample = setInterval(() => {
    try {
      cpu = cpuSecondsOf(child.pid as number);
    } catch {
      // exited
    }
  }, 200);
  child.stdout.on('data', (d) => {
    out += d;
  });
  child.stderr.on('data', (d) => {
    err = (err + d).slice(-2000);
  });
  const code = await new Promise<number | null>((r) => child.on('close', r));
  clearInterval(sample);
  if (code !== 0) throw new Error(`autocannon exited with ${code}: ${err}`);
  const j = JSON.parse(out) as {
    requests: { average: number; total: number };
    latency: { p50: number; p99: number };
    errors: number;
    non2xx: number;
  };
  return {
    requestsPerSecond: j.requests.average,
    requests: j.requests.total,
    p50: j.latency.p50,
    p99: j.latency.p99,
    errors: j.errors,
    non2xx: j.non2xx,
    clientCpuSeconds: cpu,
  };
}
