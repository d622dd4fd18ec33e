/**
 * The price of the edge: requests per second and latency of the service behind the
 * uWebSockets.js edge (which forwards to Fastify over a keep-alive pool on a Unix socket)
 * against Fastify serving directly, measured in one run, alternating rounds so machine noise
 * falls on both. Writes bench/reports/forward-<timestamp>.{json,md} and prints the ratios.
 *
 *   npm run bench -- [--seconds 10] [--rounds 2] [--connections 50]
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = fileURLToPath(new URL('../../', import.meta.url));
const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '10' },
    rounds: { type: 'string', default: '2' },
    connections: { type: 'string', default: '50' },
  },
});
const seconds = Number(values.seconds);
const rounds = Number(values.rounds);
const connections = Number(values.connections);

interface Target {
  child: ChildProcess;
  url: string;
}

async function startTarget(mode: 'edge' | 'direct'): Promise<Target> {
  const child = spawn(process.execPath, ['--import', 'tsx', join(root, 'bench/src/serve.ts'), mode], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout?.on('data', (d) => {
      out += d;
      const m = /READY (\S+)/.exec(out);
      if (m?.[1]) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`target exited with ${code}`)));
  });
  return { child, url };
}

interface Result {
  requests: number;
  p50: number;
  p99: number;
  errors: number;
  non2xx: number;
}

/** autocannon in its own process, so the load generator does not share the server's event loop. */
async function load(url: string, method: 'GET' | 'POST', path: string, body?: string): Promise<Result> {
  const args = [
    join(root, 'node_modules/autocannon/autocannon.js'),
    '-c',
    String(connections),
    '-d',
    String(seconds),
    '-j',
    '-m',
    method,
  ];
  if (body) args.push('-H', 'content-type=application/json', '-b', body);
  args.push(`${url}${path}`);
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'ignore'] });
  let out = '';
  child.stdout.on('data', (d) => {
    out += d;
  });
  await new Promise((r) => child.on('close', r));
  const j = JSON.parse(out) as {
    requests: { average: number };
    latency: { p50: number; p99: number };
    errors: number;
    non2xx: number;
  };
  return { requests: j.requests.average, p50: j.latency.p50, p99: j.latency.p99, errors: j.errors, non2xx: j.non2xx };
}

const cases = [
  { name: 'GET /api/health (tiny JSON)', method: 'GET' as const, path: '/api/health' },
  {
    name: 'POST /api/oauth/token (JSON body, 400 answer, no storage)',
    method: 'POST' as const,
    path: '/api/oauth/token',
    body: '{"grant_type":"password","code":"x"}',
  },
];

const results: Record<string, Record<'edge' | 'direct', Result[]>> = {};
for (const c of cases) results[c.name] = { edge: [], direct: [] };

for (let round = 0; round < rounds; round++) {
  for (const mode of round % 2 === 0 ? (['edge', 'direct'] as const) : (['direct', 'edge'] as const)) {
    const target = await startTarget(mode);
    for (const c of cases) {
      await load(target.url, c.method, c.path, c.body); // warm-up, not recorded
      const r = await load(target.url, c.method, c.path, c.body);
      results[c.name]?.[mode].push(r);
      process.stdout.write(
        `round ${round + 1} ${mode.padEnd(6)} ${c.name}: ${Math.round(r.requests)} req/s, p50 ${r.p50} ms, p99 ${r.p99} ms\n`,
      );
    }
    target.child.kill('SIGTERM');
    await new Promise((r) => target.child.on('exit', r));
  }
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const lines = [
  `# Edge forwarding cost (${new Date().toISOString()})`,
  '',
  `autocannon, ${connections} connections, ${seconds} s per measurement after a warm-up, ${rounds} rounds alternating order; Node ${process.version}.`,
  '',
  '| case | edge req/s | direct req/s | edge / direct | edge p99 ms | direct p99 ms |',
  '|---|---|---|---|---|---|',
];
const summary: Record<string, unknown> = {};
for (const c of cases) {
  const r = results[c.name] as Record<'edge' | 'direct', Result[]>;
  const e = mean(r.edge.map((x) => x.requests));
  const d = mean(r.direct.map((x) => x.requests));
  lines.push(
    `| ${c.name} | ${Math.round(e)} | ${Math.round(d)} | ${(e / d).toFixed(2)} | ${mean(r.edge.map((x) => x.p99)).toFixed(1)} | ${mean(r.direct.map((x) => x.p99)).toFixed(1)} |`,
  );
  summary[c.name] = { edge: r.edge, direct: r.direct, ratio: e / d };
}
const report = lines.join('\n');
process.stdout.write(`\n${report}\n`);
const dir = join(root, 'bench/reports');
mkdirSync(dir, { recursive: true });
const stamp = new Date().toISOString().replace(/[:.]/g, '-');
writeFileSync(
  join(dir, `forward-${stamp}.json`),
  `${JSON.stringify({ connections, seconds, rounds, summary }, null, 2)}\n`,
);
writeFileSync(join(dir, `forward-${stamp}.md`), `${report}\n`);
