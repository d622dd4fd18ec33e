import { autocannon, type LoadResult } from '../lib/autocannon.ts';
import { startOurs } from '../lib/ours.ts';
import { type Outcome, ratioTarget, type Scenario } from '../lib/scenario.ts';
import { mean, round } from '../lib/stats.ts';

/**
 * The price of the edge on request/response: `GET /api/agents` and `POST /api/agents` through
 * the uWebSockets.js edge (which forwards to Fastify over a keep-alive pool on a Unix socket)
 * against the same Fastify app listening directly, one process each, measured in one run in
 * alternating rounds so machine noise falls on both.
 */
export const crud: Scenario = {
  name: 'crud',
  title: 'crud: the API through the edge against Fastify served directly',
  defaults: { connections: 50, duration: 10, rate: 0 },
  smoke: { connections: 4, duration: 1, rate: 0 },
  async run({ opts, progress }): Promise<Outcome> {
    const rounds = opts.smoke ? 1 : 2;
    const cases = ['GET /api/agents', 'POST /api/agents'] as const;
    const results: Record<string, Record<'edge' | 'direct', LoadResult[]>> = {};
    for (const c of cases) results[c] = { edge: [], direct: [] };
    let clientCpu = 0;
    for (let round = 0; round < rounds; round++) {
      for (const mode of round % 2 === 0 ? (['edge', 'direct'] as const) : (['direct', 'edge'] as const)) {
        const target = await startOurs({ EDGE: mode === 'edge' ? 'true' : 'false' });
        try {
          const me = await target.call<{ key: string }>('tenant#signUp');
          const headers = { authorization: `Bearer ${me.key}`, 'content-type': 'application/json' };
          const env = (await (
            await fetch(`${target.url}/api/environments`, {
              method: 'POST',
              headers,
              body: JSON.stringify({ name: 'bench' }),
            })
          ).json()) as { id: string };
          // A handful of agents so the list is not empty.
          for (let i = 0; i < 5; i++) {
            await fetch(`${target.url}/api/agents`, {
              method: 'POST',
              headers,
              body: JSON.stringify({
                name: `seed ${i}`,
                runtime: 'claude',
                model: 'anthropic/x',
                environment_id: env.id,
              }),
            });
          }
          const body = JSON.stringify({
            name: 'bench [<id>]',
            runtime: 'claude',
            model: 'anthropic/x',
            environment_id: env.id,
          });
          for (const c of cases) {
            const load = {
              url: `${target.url}/api/agents${c.startsWith('GET') ? '?limit=20' : ''}`,
              connections: opts.connections,
              seconds: opts.duration,
              method: c.startsWith('GET') ? ('GET' as const) : ('POST' as const),
              headers,
              body: c.startsWith('POST') ? body : undefined,
              idReplacement: c.startsWith('POST'),
            };
            progress.update(`round ${round + 1}/${rounds} ${mode}: ${c} (warm-up)`);
            if (!opts.smoke) await autocannon({ ...load, seconds: Math.min(3, opts.duration) });
            progress.update(`round ${round + 1}/${rounds} ${mode}: ${c} for ${opts.duration}s`);
            const r = await autocannon(load);
            clientCpu += r.clientCpuSeconds;
            results[c]?.[mode].push(r);
            progress.say(
              `round ${round + 1} ${mode.padEnd(6)} ${c}: ${Math.round(r.requestsPerSecond)} req/s, p99 ${r.p99} ms, non-2xx ${r.non2xx}, errors ${r.errors}`,
            );
          }
        } finally {
          await target.stop();
        }
      }
    }
    const figures: Record<string, unknown> = { rounds, connections: opts.connections, seconds: opts.duration };
    const targets = [];
    const bars = [];
    for (const c of cases) {
      const r = results[c] as Record<'edge' | 'direct', LoadResult[]>;
      const edge = mean(r.edge.map((x) => x.requestsPerSecond));
      const direct = mean(r.direct.map((x) => x.requestsPerSecond));
      const failures = [...r.edge, ...r.direct].reduce((a, x) => a + x.errors + x.non2xx, 0);
      figures[c] = {
        edge: r.edge,
        direct: r.direct,
        edgeRequestsPerSecond: round(edge),
        directRequestsPerSecond: round(direct),
        ratio: round(edge / direct, 3),
        failures,
      };
      const t = ratioTarget(
        `${c} requests/s through the edge`,
        'req/s',
        edge,
        { name: 'Fastify direct', value: direct },
        { atLeast: 0.6 },
        !opts.smoke,
      );
      if (failures > 0) {
        t.met = false;
        t.note = `${failures} failed or non-2xx responses`;
      }
      targets.push(t);
      bars.push({ label: c, value: edge, who: 'ours (edge)' }, { label: c, value: direct, who: 'Fastify direct' });
    }
    return {
      figures,
      targets,
      charts: [{ kind: 'bars', file: 'throughput', title: 'Requests per second', unit: 'req/s', bars }],
      notes: [
        `autocannon, ${opts.connections} connections, ${opts.duration} s per measurement after a warm-up, ${rounds} round(s) alternating which goes first; one service process each, embedded PGlite storage.`,
        'Both serve the same Fastify app on the same storage; the difference is the edge hop (uWebSockets.js accepting, rate-limit check, forwarding over a Unix socket).',
      ],
      clientCpuSeconds: clientCpu,
    };
  },
};
