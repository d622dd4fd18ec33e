import { autocannon, type LoadResult } from '../lib/autocannon.ts';
import { type Ours, startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import { cpuOfTree } from '../lib/proc.ts';
import { type Outcome, ratioTarget, reported, type Scenario, type Target } from '../lib/scenario.ts';
import { mean, round } from '../lib/stats.ts';
import type { Bar } from '../lib/svg.ts';

/** Where a load ran: our service through its edge, the same app with Fastify listening, or a bench twin. */
type Where = 'edge' | 'direct' | 'auth' | 'open';

interface Case {
  name: string;
  path: string;
  method: 'GET' | 'POST';
  /** Sends the bearer key (and, for POST, a body). */
  auth: boolean;
}

const CASES: Case[] = [
  { name: 'GET /api/health', path: '/api/health', method: 'GET', auth: false },
  // Every GET runs before POST adds agents: the list is not paginated (a `limit` is not taken),
  // so after a POST load its response grows with every agent created.
  { name: 'GET /api/agents', path: '/api/agents', method: 'GET', auth: true },
  { name: 'POST /api/agents', path: '/api/agents', method: 'POST', auth: true },
];
const TWIN_CASE = 'GET /api/agents';

/** One load's figures: autocannon's, and the server's CPU over it. */
interface Measured extends LoadResult {
  /** CPU of the service's process over the load, per response, in µs. */
  serverCpuMicros: number;
  /** CPU of the Postgres cluster (every backend) over the load, per response, in µs. */
  postgresCpuMicros: number;
}

/** An account with an environment and five agents; the headers and POST body the load sends. */
async function seed(target: Ours): Promise<{ key: string; headers: Record<string, string>; body: string }> {
  const me = await target.call<{ key: string }>('tenant#signUp');
  const headers = { authorization: `Bearer ${me.key}`, 'content-type': 'application/json' };
  const res = await fetch(`${target.url}/api/environments`, {
    method: 'POST',
    headers,
    body: JSON.stringify({ name: 'bench' }),
  });
  if (res.status !== 201) throw new Error(`seeding: POST /api/environments answered ${res.status}`);
  const env = (await res.json()) as { id: string };
  const agent = (name: string) =>
    JSON.stringify({ name, runtime: 'claude', model: 'anthropic/x', environment_id: env.id });
  // A handful of agents so the list is not empty.
  for (let i = 0; i < 5; i++) {
    const r = await fetch(`${target.url}/api/agents`, { method: 'POST', headers, body: agent(`seed ${i}`) });
    if (r.status !== 201) throw new Error(`seeding: POST /api/agents answered ${r.status}`);
  }
  return { key: me.key, headers, body: agent('bench [<id>]') };
}

/** Rounds of each comparison in a full run: each side measured once per round, the first alternating. */
const ROUNDS = 4;

/**
 * The price of the edge and of authentication on request/response, on a throwaway Postgres:
 * `GET /api/health`, `GET /api/agents` and `POST /api/agents` through the uWebSockets.js edge
 * against the same Fastify app listening directly; `GET /api/agents` on bench twins of the
 * agent routes with and without the service's authentication hook (ops/crud.ts); the server's
 * CPU per request beside each req/s (the embedded database against a server: the `embedded`
 * scenario). The two sides of each comparison run side by side, idle but for the load, and are
 * measured in short turns (ROUNDS each, the first alternating), so what the shared machine does
 * meanwhile falls on both alike.
 */
export const crud: Scenario = {
  name: 'crud',
  title: 'crud: the API through the edge against Fastify served directly, and authentication, on Postgres',
  defaults: { connections: 50, duration: 6, rate: 0 },
  smoke: { connections: 4, duration: 1, rate: 0 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const rounds = opts.smoke ? 1 : ROUNDS;
    progress.update('starting Postgres');
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const results: Record<string, Partial<Record<Where, Measured[]>>> = {};
    const add = (c: string, where: Where, m: Measured) => {
      const byWhere = results[c] ?? {};
      results[c] = byWhere;
      byWhere[where] = [...(byWhere[where] ?? []), m];
    };
    let clientCpu = 0;

    type Load = Parameters<typeof autocannon>[0];
    const warm = async (label: string, load: Load) => {
      if (opts.smoke) return;
      progress.update(`${label} (warm-up)`);
      await autocannon({ ...load, seconds: 3 });
    };
    const measure = async (
      target: Ours,
      label: string,
      load: Load,
      postgresPid: number | undefined,
    ): Promise<Measured> => {
      progress.update(`${label} for ${opts.duration}s`);
      const cpu0 = cpuOfTree(target.pid);
      const pg0 = postgresPid ? cpuOfTree(postgresPid) : 0;
      const r = await autocannon(load);
      const cpu = cpuOfTree(target.pid) - cpu0;
      const pgCpu = postgresPid ? cpuOfTree(postgresPid) - pg0 : Number.NaN;
      clientCpu += r.clientCpuSeconds;
      const per = (s: number) => (r.requests > 0 ? round((s * 1e6) / r.requests, 1) : Number.NaN);
      const m: Measured = { ...r, serverCpuMicros: per(cpu), postgresCpuMicros: per(pgCpu) };
      progress.say(
        `${label}: ${Math.round(r.requestsPerSecond)} req/s, p99 ${r.p99} ms, server CPU ${m.serverCpuMicros} µs/request${postgresPid ? `, Postgres ${m.postgresCpuMicros} µs/request` : ''}, non-2xx ${r.non2xx}, errors ${r.errors}`,
      );
      return m;
    };

    const loadOf = (url: string, c: Case, s: { headers: Record<string, string>; body: string }): Load => ({
      url: `${url}${c.path}`,
      connections: opts.connections,
      seconds: opts.duration,
      method: c.method,
      headers: c.auth ? s.headers : {},
      body: c.method === 'POST' ? s.body : undefined,
      idReplacement: c.method === 'POST',
    });

    /** One comparison: both sides warmed once, then measured in turns, the first alternating. */
    const compare = async (c: string, sides: [Where, Ours, Load][]) => {
      for (const [where, , load] of sides) await warm(`${where} ${c}`, load);
      for (let r = 0; r < rounds; r++) {
        for (const [where, target, load] of r % 2 === 0 ? sides : [...sides].reverse()) {
          add(c, where, await measure(target, `round ${r + 1} ${where} ${c}`, load, pg.pid));
        }
      }
    };

    // Each its own account; one after the other, so they do not migrate the database at once.
    const edge = await startOurs({ EDGE: 'true', DATABASE_URL: pg.url });
    defer(() => edge.stop());
    const direct = await startOurs({ EDGE: 'false', DATABASE_URL: pg.url });
    defer(() => direct.stop());
    const seeds = { edge: await seed(edge), direct: await seed(direct) };
    for (const c of CASES) {
      await compare(c.name, [
        ['edge', edge, loadOf(edge.url, c, seeds.edge)],
        ['direct', direct, loadOf(direct.url, c, seeds.direct)],
      ]);
      // The twins right after the same route on the service, before POST fills the list.
      if (c.name === TWIN_CASE) {
        const ports = await direct.call<{ auth: number; open: number }>('ops/crud#startTwins', {
          key: seeds.direct.key,
        });
        const twin = (w: 'auth' | 'open'): [Where, Ours, Load] => [
          w,
          direct,
          loadOf(`http://127.0.0.1:${ports[w]}`, c, seeds.direct),
        ];
        await compare(c.name, [twin('auth'), twin('open')]);
        await direct.call('ops/crud#closeTwins');
      }
    }
    await edge.stop();
    await direct.stop();

    const decide = !opts.smoke;
    const of = (c: string, w: Where) => results[c]?.[w] ?? [];
    const rps = (c: string, w: Where) => mean(of(c, w).map((x) => x.requestsPerSecond));
    const micros = (c: string, w: Where) => mean(of(c, w).map((x) => x.serverCpuMicros));
    const failures = (c: string, ws: Where[]) =>
      ws.reduce((a, w) => a + of(c, w).reduce((b, x) => b + x.errors + x.non2xx, 0), 0);
    const failed = (t: Target, c: string, ws: Where[]): Target => {
      const n = failures(c, ws);
      if (n > 0) {
        t.note = `${n} failed or non-2xx responses`;
        if (decide) t.met = false;
      }
      return t;
    };
    const EDGE_GOALS: Record<string, number> = {
      'GET /api/health': 0.8,
      'GET /api/agents': 0.6,
      'POST /api/agents': 0.6,
    };
    const targets: Target[] = [];
    for (const c of CASES) {
      targets.push(
        failed(
          ratioTarget(
            `${c.name} requests/s through the edge`,
            'req/s',
            rps(c.name, 'edge'),
            { name: 'Fastify direct', value: rps(c.name, 'direct') },
            { atLeast: EDGE_GOALS[c.name] as number },
            decide,
          ),
          c.name,
          ['edge', 'direct'],
        ),
      );
    }
    targets.push(
      failed(
        ratioTarget(
          `${TWIN_CASE} requests/s with authentication (bench twins of the route)`,
          'req/s',
          rps(TWIN_CASE, 'auth'),
          { name: 'the same route without authentication', value: rps(TWIN_CASE, 'open') },
          { atLeast: 0.95 },
          decide,
        ),
        TWIN_CASE,
        ['auth', 'open'],
      ),
    );
    for (const c of CASES) {
      targets.push(
        reported(
          ratioTarget(
            `${c.name} server CPU per request through the edge`,
            'µs',
            micros(c.name, 'edge'),
            { name: 'Fastify direct', value: micros(c.name, 'direct') },
            { atMost: 1 },
          ),
        ),
      );
    }
    targets.push(
      reported(
        ratioTarget(
          `${TWIN_CASE} server CPU per request with authentication (bench twins)`,
          'µs',
          micros(TWIN_CASE, 'auth'),
          { name: 'without authentication', value: micros(TWIN_CASE, 'open') },
          { atMost: 1 },
        ),
      ),
    );
    const figures: Record<string, unknown> = { rounds, connections: opts.connections, seconds: opts.duration };
    const bars: Bar[] = [];
    const names: Record<Where, string> = {
      edge: 'ours (edge)',
      direct: 'Fastify direct',
      auth: 'twin with auth',
      open: 'twin without auth',
    };
    const who: Record<Where, string> = { edge: 'ours', direct: 'floor', auth: 'ours', open: 'floor' };
    for (const c of CASES) {
      const per: Record<string, unknown> = {};
      for (const w of Object.keys(names) as Where[]) {
        if (of(c.name, w).length === 0) continue;
        per[w] = {
          runs: of(c.name, w),
          requestsPerSecond: round(rps(c.name, w)),
          serverCpuMicros: round(micros(c.name, w), 1),
        };
        bars.push({ label: `${c.name} ${names[w]}`, value: rps(c.name, w), who: who[w] });
      }
      figures[c.name] = per;
    }
    const line = (c: string, w: Where) =>
      of(c, w).length
        ? `${names[w]} ${Math.round(rps(c, w))} req/s, ${round(micros(c, w), 1)} µs server CPU + ${round(mean(of(c, w).map((x) => x.postgresCpuMicros)), 1)} µs Postgres per request`
        : undefined;
    return {
      figures,
      targets,
      charts: [{ kind: 'bars', file: 'throughput', title: 'Requests per second', unit: 'req/s', bars }],
      notes: [
        `autocannon, ${opts.connections} connections, ${opts.duration} s per measurement. The two sides of a comparison (edge and direct; the twins with and without authentication) run side by side, each warmed up once for 3 s on the route, then measured in ${rounds} round(s), one measurement of each per round, the first alternating; the figure is the mean over the rounds. Edge and direct are a service process each, both up for the whole comparison and idle but for the load, on one throwaway PostgreSQL (fsync off) started for the run, the event log in memory.`,
        'Edge against direct: both serve the same Fastify app on the same database; the difference is the edge: uWebSockets.js accepting and parsing, the rate-limit check (off here), and the hand-off of the request to the Fastify app in the same process (a node:http request and response over a stand-in socket, no socket between them).',
        `With and without authentication: two bench-only Fastify instances in the service's process, each serving the service's own agent route module (the same handler, schemas and serialization) on the service's database pool. One has the service's authentication hook (the bearer key's credential lookup on every request, as the service does); the other sets the principal that key authenticates to, looked up once. Neither has the service's other hooks, so the ratio is authentication's cost alone. The service offers no way to reach its own \`GET /api/agents\` without authentication, so this is the nearest honest comparison the bench can make without changing the service.`,
        'Server CPU per request: utime + stime of the service process (edge and api role together) from /proc/<pid>/stat before and after each load, over the responses; the Postgres cluster likewise (every backend).',
        ...CASES.map(
          (c) =>
            `${c.name}: ${(['edge', 'direct', 'auth', 'open'] as Where[])
              .map((w) => line(c.name, w))
              .filter(Boolean)
              .join('; ')}.`,
        ),
      ],
      clientCpuSeconds: clientCpu,
    };
  },
};
