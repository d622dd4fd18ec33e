import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { autocannon, type LoadResult } from '../lib/autocannon.ts';
import { repoRoot } from '../lib/machine.ts';
import { startPostgres } from '../lib/postgres.ts';
import { cpuOfTree, freePort, pssOfTree, rssOfTree, sleep, stopChild, treeOf } from '../lib/proc.ts';
import { absoluteTarget, type Outcome, ratioTarget, reported, type Scenario, type Target } from '../lib/scenario.ts';
import { mean, median, round } from '../lib/stats.ts';
import type { Bar } from '../lib/svg.ts';

/** The service as `npm start` runs it (gateway/start.mjs) from `tree`, until stopped. */
interface Running {
  child: ChildProcess;
  url: string;
  /** From spawn to the first 200 of GET /api/health, in ms. */
  firstAnswerMs: number;
  stop(): Promise<void>;
}

async function startTree(tree: string, dataDir: string, env: Record<string, string>): Promise<Running> {
  const port = await freePort();
  const base = { ...process.env };
  for (const k of ['DATABASE_URL', 'REDIS_URL', 'PORT', 'DATA_DIR']) delete base[k];
  const began = performance.now();
  const child = spawn(process.execPath, ['gateway/start.mjs'], {
    cwd: tree,
    env: {
      ...base,
      PORT: String(port),
      HOST: '127.0.0.1',
      DATA_DIR: dataDir,
      RATE_LIMIT_PER_MINUTE: '0',
      LOG_LEVEL: 'warn',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const keep = (d: Buffer) => {
    out = (out + d.toString()).slice(-8192);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  const url = `http://127.0.0.1:${port}`;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`${tree}: npm start exited (${child.exitCode}):\n${out}`);
    if (performance.now() - began > 120_000) {
      child.kill('SIGKILL');
      throw new Error(`${tree}: no answer within 120 s:\n${out}`);
    }
    const ok = await fetch(`${url}/api/health`).then(
      (r) => r.status === 200,
      () => false,
    );
    if (ok) break;
    await sleep(20);
  }
  return { child, url, firstAnswerMs: performance.now() - began, stop: () => stopChild(child, 30_000) };
}

/** An account signed up through the API as a user does (the link from the mail file): its key. */
async function signUp(url: string, dataDir: string): Promise<string> {
  const post = async (path: string, body: unknown) => {
    const res = await fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return (await res.json()) as Record<string, string>;
  };
  const email = `bench-${randomBytes(4).toString('hex')}@example.com`;
  const password = 'a long bench password';
  await post('/api/auth/register', { email, password });
  const mailDir = join(dataDir, 'mail');
  let token: string | undefined;
  // The mail is sent after the answer; its folder is made with the first one.
  for (const deadline = Date.now() + 30_000; !token && Date.now() < deadline; ) {
    const entries = existsSync(mailDir) ? readdirSync(mailDir, { withFileTypes: true }) : [];
    for (const f of entries.filter((e) => e.isFile())) {
      const text = readFileSync(join(mailDir, f.name), 'utf8');
      if (text.includes(email)) token = /token=([A-Za-z0-9_-]+)/.exec(text)?.[1];
    }
    if (!token) await sleep(50);
  }
  if (!token) throw new Error('no verification mail');
  await post('/api/auth/verify', { token });
  const key = (await post('/api/auth/token', { email, password })).key;
  if (!key) throw new Error('no key');
  return key;
}

interface Seeded {
  headers: Record<string, string>;
  environmentId: string;
  agentBody: string;
}

async function seed(url: string, key: string): Promise<Seeded> {
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const res = await fetch(`${url}/api/environments`, { method: 'POST', headers, body: JSON.stringify({ name: 'b' }) });
  if (res.status !== 201) throw new Error(`seeding: POST /api/environments answered ${res.status}`);
  const env = (await res.json()) as { id: string };
  const agent = (name: string) =>
    JSON.stringify({ name, runtime: 'claude', model: 'anthropic/x', environment_id: env.id });
  for (let i = 0; i < 5; i++) {
    const r = await fetch(`${url}/api/agents`, { method: 'POST', headers, body: agent(`seed ${i}`) });
    if (r.status !== 201) throw new Error(`seeding: POST /api/agents answered ${r.status}`);
  }
  return { headers, environmentId: env.id, agentBody: agent('bench [<id>]') };
}

/** `n` secret upserts sent at once; each one's latency in ms, and the failures. */
async function concurrentWrites(url: string, s: Seeded, n: number, round: number) {
  let failed = 0;
  const latencies = await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const began = performance.now();
      const res = await fetch(`${url}/api/environments/${s.environmentId}/secrets`, {
        method: 'POST',
        headers: s.headers,
        body: JSON.stringify({ key: `K_${round}_${i}`, value: randomBytes(16).toString('hex') }),
      });
      await res.arrayBuffer();
      if (res.status !== 201) failed++;
      return performance.now() - began;
    }),
  );
  return { latencies, failed };
}

type Side = 'embedded' | 'server' | 'baseline';

interface SideFigures {
  tree: string;
  firstStartMs: number;
  secondStartMs: number;
  idleRssBytes: number;
  idlePssBytes: number;
  processes: number;
}
const NAMES: Record<Side, string> = {
  embedded: 'embedded PostgreSQL (npm start)',
  server: 'Postgres server (DATABASE_URL)',
  baseline: 'baseline tree (BENCH_EMBEDDED_BASELINE)',
};

/**
 * The embedded default as a user meets it: `npm start` (gateway/start.mjs) on a fresh
 * DATA_DIR, against the same service on a PostgreSQL server (DATABASE_URL), in one run: the
 * time to a first answer (first start, which makes the cluster, and a second on the same
 * data), the idle memory of the whole process tree, `GET` and `POST /api/agents` through the
 * edge, and 50 writes sent at once. With BENCH_EMBEDDED_BASELINE naming another checkout (with
 * its dependencies installed), that tree's `npm start` is measured the same way, as the
 * baseline of the start time and the footprint.
 */
export const embedded: Scenario = {
  name: 'embedded',
  title: 'embedded: npm start on its embedded database against the same service on a Postgres server',
  defaults: { connections: 50, duration: 6, rate: 0 },
  smoke: { connections: 4, duration: 1, rate: 0 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const rounds = opts.smoke ? 1 : 3;
    const idleSeconds = opts.smoke ? 1 : 10;
    const writers = opts.smoke ? 10 : 50;
    progress.update('starting Postgres');
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const baselineTree = process.env.BENCH_EMBEDDED_BASELINE;
    const sides: [Side, string, Record<string, string>][] = [
      ['embedded', repoRoot, {}],
      ['server', repoRoot, { DATABASE_URL: pg.url, MASTER_KEY: randomBytes(32).toString('hex') }],
    ];
    if (baselineTree) sides.push(['baseline', baselineTree, {}]);

    const figures: Partial<Record<Side, SideFigures>> = {};
    const running = new Map<Side, { run: Running; seeded: Seeded; dataDir: string }>();
    let clientCpu = 0;
    for (const [side, tree, env] of sides) {
      const dataDir = mkdtempSync(join(tmpdir(), `svc-bench-embedded-${side}-`));
      defer(() => rmSync(dataDir, { recursive: true, force: true }));
      progress.update(`${side}: first start`);
      const first = await startTree(tree, dataDir, env);
      await first.stop();
      progress.update(`${side}: second start`);
      const run = await startTree(tree, dataDir, env);
      defer(() => run.stop());
      progress.update(`${side}: idle ${idleSeconds} s`);
      await sleep(idleSeconds * 1000);
      const f: SideFigures = {
        tree,
        firstStartMs: round(first.firstAnswerMs),
        secondStartMs: round(run.firstAnswerMs),
        idleRssBytes: rssOfTree(run.child.pid as number),
        idlePssBytes: pssOfTree(run.child.pid as number),
        processes: treeOf(run.child.pid as number).length,
      };
      figures[side] = f;
      progress.say(
        `${side}: first answer ${round(first.firstAnswerMs / 1000, 2)} s (fresh), ${round(run.firstAnswerMs / 1000, 2)} s (again); idle RSS ${round(f.idleRssBytes / 2 ** 20, 1)} MB, PSS ${round(f.idlePssBytes / 2 ** 20, 1)} MB over ${f.processes} processes`,
      );
      const seeded = await seed(run.url, await signUp(run.url, dataDir));
      running.set(side, { run, seeded, dataDir });
    }

    // The writes at once, each side in turn, rounds alternating.
    const writes: Record<string, { medians: number[]; maxes: number[]; failed: number }> = {};
    const compared = sides.map(([s]) => s);
    for (let r = 0; r < rounds; r++) {
      for (const side of r % 2 === 0 ? compared : [...compared].reverse()) {
        const { run, seeded } = running.get(side) as { run: Running; seeded: Seeded };
        const w = await concurrentWrites(run.url, seeded, writers, r);
        const entry = writes[side] ?? { medians: [], maxes: [], failed: 0 };
        writes[side] = entry;
        entry.medians.push(median(w.latencies));
        entry.maxes.push(Math.max(...w.latencies));
        entry.failed += w.failed;
        progress.say(
          `round ${r + 1} ${side}: ${writers} writes at once, median ${round(median(w.latencies))} ms, max ${round(Math.max(...w.latencies))} ms`,
        );
      }
    }

    // GET and POST /api/agents through the edge, embedded against the server, rounds alternating.
    const loads: Record<string, Partial<Record<Side, (LoadResult & { serverCpuMicros: number })[]>>> = {};
    for (const [name, method] of [
      ['GET /api/agents', 'GET'],
      ['POST /api/agents', 'POST'],
    ] as const) {
      const pair: Side[] = ['embedded', 'server'];
      const loadOf = (side: Side) => {
        const { run, seeded } = running.get(side) as { run: Running; seeded: Seeded };
        return {
          url: `${run.url}/api/agents`,
          connections: opts.connections,
          seconds: opts.duration,
          method,
          headers: seeded.headers,
          body: method === 'POST' ? seeded.agentBody : undefined,
          idReplacement: method === 'POST',
        };
      };
      if (!opts.smoke) {
        for (const side of pair) {
          progress.update(`${side} ${name} (warm-up)`);
          await autocannon({ ...loadOf(side), seconds: 3 });
        }
      }
      for (let r = 0; r < rounds; r++) {
        for (const side of r % 2 === 0 ? pair : [...pair].reverse()) {
          progress.update(`round ${r + 1} ${side} ${name} for ${opts.duration}s`);
          const pid = (running.get(side) as { run: Running }).run.child.pid as number;
          const cpu0 = cpuOfTree(pid);
          const res = await autocannon(loadOf(side));
          const cpu = cpuOfTree(pid) - cpu0;
          clientCpu += res.clientCpuSeconds;
          const m = { ...res, serverCpuMicros: res.requests ? round((cpu * 1e6) / res.requests, 1) : Number.NaN };
          const byName = loads[name] ?? {};
          loads[name] = byName;
          byName[side] = [...(byName[side] ?? []), m];
          progress.say(
            `round ${r + 1} ${side} ${name}: ${Math.round(res.requestsPerSecond)} req/s, p99 ${res.p99} ms, CPU of its process tree ${m.serverCpuMicros} µs/request, non-2xx ${res.non2xx}, errors ${res.errors}`,
          );
        }
      }
    }

    const decide = !opts.smoke;
    const targets: Target[] = [];
    const e = figures.embedded as SideFigures;
    const b = figures.baseline;
    targets.push(
      absoluteTarget(
        'idle RSS of the whole npm start tree (embedded)',
        'MB',
        round(e.idleRssBytes / 2 ** 20, 1),
        { atMost: 250 },
        decide,
      ),
    );
    targets.push(
      reported(
        absoluteTarget('idle PSS of the whole npm start tree (embedded)', 'MB', round(e.idlePssBytes / 2 ** 20, 1), {
          atMost: 250,
        }),
      ),
    );
    const rps = (name: string, side: Side) => mean((loads[name]?.[side] ?? []).map((x) => x.requestsPerSecond));
    const bad = (name: string) =>
      (['embedded', 'server'] as Side[]).reduce(
        (a, s) => a + (loads[name]?.[s] ?? []).reduce((x, m) => x + m.errors + m.non2xx, 0),
        0,
      );
    for (const name of ['GET /api/agents', 'POST /api/agents']) {
      const t = ratioTarget(
        `${name} requests/s through the edge, embedded`,
        'req/s',
        rps(name, 'embedded'),
        { name: NAMES.server, value: rps(name, 'server') },
        { atLeast: 0.8 },
        decide,
      );
      if (bad(name) > 0) {
        t.note = `${bad(name)} failed or non-2xx responses`;
        if (decide) t.met = false;
      }
      targets.push(t);
    }
    const writeMedian = (side: Side) => mean(writes[side]?.medians ?? []);
    const wt = ratioTarget(
      `${writers} secret writes sent at once: median latency, embedded`,
      'ms',
      round(writeMedian('embedded'), 1),
      { name: NAMES.server, value: round(writeMedian('server'), 1) },
      { atMost: 2 },
      decide,
    );
    const writeFailures = (writes.embedded?.failed ?? 0) + (writes.server?.failed ?? 0);
    if (writeFailures > 0) {
      wt.note = `${writeFailures} writes did not answer 201`;
      if (decide) wt.met = false;
    }
    targets.push(wt);
    if (b) {
      targets.push(
        ratioTarget(
          'npm start to a first answer, on existing data',
          'ms',
          round(e.secondStartMs),
          { name: NAMES.baseline, value: round(b.secondStartMs) },
          { atMost: 1 },
          decide,
        ),
        reported(
          ratioTarget(
            'npm start to a first answer, fresh DATA_DIR',
            'ms',
            round(e.firstStartMs),
            { name: NAMES.baseline, value: round(b.firstStartMs) },
            { atMost: 1 },
          ),
        ),
        reported(
          ratioTarget(
            'idle RSS of the whole npm start tree',
            'MB',
            round(e.idleRssBytes / 2 ** 20, 1),
            { name: NAMES.baseline, value: round(b.idleRssBytes / 2 ** 20, 1) },
            { atMost: 1 },
          ),
        ),
        reported(
          ratioTarget(
            `${writers} secret writes sent at once: median latency`,
            'ms',
            round(writeMedian('embedded'), 1),
            { name: NAMES.baseline, value: round(writeMedian('baseline'), 1) },
            { atMost: 1 },
          ),
        ),
      );
    } else {
      targets.push(
        reported(
          absoluteTarget('npm start to a first answer, on existing data', 'ms', round(e.secondStartMs), {
            atMost: Number.POSITIVE_INFINITY,
          }),
        ),
        reported(
          absoluteTarget('npm start to a first answer, fresh DATA_DIR', 'ms', round(e.firstStartMs), {
            atMost: Number.POSITIVE_INFINITY,
          }),
        ),
      );
    }

    const bars: Bar[] = [];
    for (const name of Object.keys(loads)) {
      for (const side of ['embedded', 'server'] as Side[])
        bars.push({ label: `${name} ${side}`, value: rps(name, side), who: side === 'embedded' ? 'ours' : 'floor' });
    }
    return {
      figures: { ...figures, writes, loads, rounds, writers, idleSeconds },
      targets,
      charts: [
        { kind: 'bars', file: 'throughput', title: 'Requests per second through the edge', unit: 'req/s', bars },
      ],
      notes: [
        `Each side is \`node gateway/start.mjs\` (what \`npm start\` runs) with its own fresh DATA_DIR, the rate limit off: started once on the empty directory and stopped (SIGTERM), then started again on it, which is the process measured. "First answer" is from the spawn to the first 200 of \`GET /api/health\`, polled every 20 ms; the fresh start includes making the database (initdb for the embedded PostgreSQL).`,
        `Idle memory: after ${idleSeconds} s without requests, the sum of VmRSS over the service's process tree (node, the embedded server's shell and every postgres process), and the sum of Pss (shared pages divided among the processes that map them, so PostgreSQL's shared buffers count once).`,
        `The embedded side runs with PostgreSQL's durability on (fsync, synchronous commit: a write is acknowledged once it is on disk); the server side is the bench's throwaway PostgreSQL ${'(Debian\u2019s, fsync and synchronous commit off)'}, so every POST and write costs the embedded side a WAL flush the server side skips.`,
        `Writes at once: ${writers} \`POST /api/environments/:id/secrets\` (a new key each, encrypted under the account's data key) sent together over fresh connections, ${rounds} round(s) alternating; the figure is the mean over rounds of each round's median latency. A database that serialises writes behind one connection shows a median near half the whole burst.`,
        `GET and POST /api/agents: autocannon, ${opts.connections} connections, ${opts.duration} s, ${rounds} round(s) alternating after a 3 s warm-up each (none in a smoke run). CPU per request is of the service's whole process tree, so the embedded side's includes its database.`,
        ...Object.entries(writes).map(
          ([side, w]) =>
            `${NAMES[side as Side]}: ${writers} writes at once, medians ${w.medians.map((x) => round(x)).join(', ')} ms; maxima ${w.maxes.map((x) => round(x)).join(', ')} ms.`,
        ),
      ],
      clientCpuSeconds: clientCpu,
    };
  },
};
