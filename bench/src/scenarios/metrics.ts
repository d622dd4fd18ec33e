import { startFleet as startRunnerFleet } from '../clients/fleet.ts';
import { autocannon } from '../lib/autocannon.ts';
import { startOurs } from '../lib/ours.ts';
import { startPostgres } from '../lib/postgres.ts';
import { largest, parseExposition, type Sample, total } from '../lib/prometheus.ts';
import { startRedis } from '../lib/redis.ts';
import type { Outcome, Scenario, Target } from '../lib/scenario.ts';
import { startFleet as startWatchers } from '../sse/fleet.ts';

/** Edge processes on the port: a scrape must answer with the series of both. */
const EDGE_PROCESSES = 2;
/** The runner's output: frames of BATCH stdout lines of PAYLOAD_BYTES, WINDOW unacknowledged. */
const BATCH = 10;
const PAYLOAD_BYTES = 100;
const WINDOW = 2;

/**
 * Series without labels of their own: every edge process has a sample of each from its start,
 * so a scrape must show each from every process.
 */
const EVERY_PROCESS = [
  'svc_rate_limited_total',
  'svc_stream_watchers',
  'svc_runner_connections',
  'svc_log_events_appended_total',
  'svc_log_events_copied_total',
  'svc_log_copy_lag_seconds',
  'svc_log_copy_pending_tenants',
  'svc_process_resident_memory_bytes',
  'svc_nodejs_eventloop_lag_p99_seconds',
];
/**
 * Series labelled by request: a process shows one only once it has answered such a request,
 * and which process the kernel hands a connection is not ours to choose, so only presence.
 */
const SOME_PROCESS = ['svc_http_requests_total', 'svc_http_request_duration_seconds_count'];

/** Lines of a scrape worth reading in the report (prom-client's other defaults and histogram buckets are not). */
const interesting = (s: Sample) =>
  (s.name.startsWith('svc_http_request') && !s.name.endsWith('_bucket')) ||
  /^svc_(stream_watchers|runner_connections|log_|rate_limited_total|process_resident_memory_bytes|process_cpu_seconds_total|nodejs_eventloop_lag_p99_seconds)/.test(
    s.name,
  );

interface Scrape {
  /** Seconds since the load started (negative: before it). */
  at: number;
  samples: Sample[];
}

/**
 * A scrape of `/metrics` under load, checked against what the load did. Our service runs with
 * EDGE_PROCESSES=2 on a throwaway Redis and PostgreSQL; N SSE watchers hold
 * `/api/events/stream` of one account, one runner (the real protocol) streams output into its
 * conversation, and autocannon drives `GET /api/health` and `GET /api/auth/me` (with an API
 * key). `/metrics` is scraped from loopback before the load, in its middle and at its end; the
 * run fails unless the series are present for both processes and agree with the load:
 * requests counted as autocannon received them, watchers = N, one runner, every acknowledged
 * event counted as appended, events copied to Postgres, nothing rate limited.
 */
export const metrics: Scenario = {
  name: 'metrics',
  title: 'metrics: a scrape of /metrics under load, checked against the load',
  defaults: { connections: 50, duration: 10, rate: 0 },
  smoke: { connections: 10, duration: 2, rate: 0 },
  async run({ opts, progress, defer }): Promise<Outcome> {
    const watchers = opts.connections;
    const perRoute = Math.max(1, Math.ceil(opts.connections / 2));
    let redisUrl = opts.redis;
    if (!redisUrl) {
      progress.update('starting Redis');
      const redis = await startRedis([], (s) => progress.say(s));
      defer(() => redis.stop());
      redisUrl = redis.url;
    }
    progress.update('starting PostgreSQL');
    const pg = await startPostgres((s) => progress.say(s));
    defer(() => pg.stop());
    const ours = await startOurs({
      REDIS_URL: redisUrl,
      DATABASE_URL: pg.url,
      EDGE_PROCESSES: String(EDGE_PROCESSES),
      RATE_LIMIT_PER_MINUTE: '0',
    });
    defer(() => ours.stop());

    const scrapes: Record<'before' | 'middle' | 'end', Scrape | undefined> = {
      before: undefined,
      middle: undefined,
      end: undefined,
    };
    let loadStart = performance.now();
    const scrape = async (): Promise<Scrape> => {
      const res = await fetch(`http://127.0.0.1:${ours.port}/metrics`);
      const text = await res.text();
      if (res.status !== 200) throw new Error(`GET /metrics answered ${res.status}: ${text.slice(0, 500)}`);
      return { at: (performance.now() - loadStart) / 1000, samples: parseExposition(text) };
    };

    progress.update('making a tenant and a runner');
    const tenant = await ours.call<{ key: string }>('tenant#signUp');
    const made = await ours.call<{ runners: { id: string; token: string; sandbox: string; conversation: string }[] }>(
      'ops/runners#makeRunners',
      { count: 1, sandboxes: true },
    );
    const runner = await startRunnerFleet(
      {
        kind: 'runner',
        url: ours.url,
        runners: made.runners,
        stream: { batch: BATCH, payloadBytes: PAYLOAD_BYTES, window: WINDOW },
      },
      { children: 1 },
    );
    defer(() => runner.close());
    const sse = startWatchers({
      port: ours.port,
      ready: ': connected',
      watchers: Array.from({ length: watchers }, () => ({
        path: '/api/events/stream',
        authorization: `Bearer ${tenant.key}`,
      })),
      inFlight: 16,
    });
    defer(() => sse.close());
    await sse.opened(60_000, (s) => progress.update(`watchers held: ${s.held}/${watchers}, ${s.failed} failed`));
    const held = sse.status();
    if (held.held !== watchers)
      throw new Error(`only ${held.held} of ${watchers} watchers opened (${held.failed} failed)`);

    scrapes.before = await scrape();
    loadStart = performance.now();
    progress.update(`load for ${opts.duration}s: runner output, GET /api/health, GET /api/auth/me`);
    runner.go(undefined, () => {});
    const middle = new Promise<void>((resolve, reject) =>
      setTimeout(
        () => {
          scrape().then((s) => {
            scrapes.middle = s;
            resolve();
          }, reject);
        },
        (opts.duration * 1000) / 2,
      ),
    );
    // Awaited after the load; a failed scrape must not go unhandled meanwhile.
    middle.catch(() => {});
    const [health, me] = await Promise.all([
      autocannon({ url: `${ours.url}/api/health`, connections: perRoute, seconds: opts.duration }),
      autocannon({
        url: `${ours.url}/api/auth/me`,
        connections: perRoute,
        seconds: opts.duration,
        headers: { authorization: `Bearer ${tenant.key}` },
      }),
      progress.countdown(opts.duration, () => `${runner.open()} runner, ${sse.status().held} watchers`),
    ]);
    await middle;
    const streamed = await runner.stop();
    scrapes.end = await scrape();
    const { before, end } = scrapes as Record<'before' | 'middle' | 'end', Scrape>;
    const mid = scrapes.middle as Scrape;

    // --- checks: what the scrapes say against what the load did
    const checks: { what: string; ok: boolean; detail: string }[] = [];
    const check = (what: string, ok: boolean, detail: string) => checks.push({ what, ok, detail });
    for (const [when, s] of [
      ['middle', mid],
      ['end', end],
    ] as const) {
      for (const name of [...EVERY_PROCESS, ...SOME_PROCESS]) {
        const processes = new Set(s.samples.filter((x) => x.name === name).map((x) => x.labels.edge_process));
        const every = EVERY_PROCESS.includes(name);
        check(
          `${when}: ${name} ${every ? 'from every edge process' : 'present'}`,
          every ? processes.size === EDGE_PROCESSES : processes.size > 0,
          `edge_process ${[...processes].sort().join(', ') || 'none'}`,
        );
      }
      const w = total(s.samples, 'svc_stream_watchers');
      check(`${when}: svc_stream_watchers = ${watchers}`, w === watchers, String(w));
      const r = total(s.samples, 'svc_runner_connections');
      check(`${when}: svc_runner_connections = 1`, r === 1, String(r));
      const lag = largest(s.samples, 'svc_log_copy_lag_seconds');
      check(`${when}: svc_log_copy_lag_seconds is a figure`, Number.isFinite(lag) && lag >= 0, String(lag));
    }
    const delta = (name: string, match: Record<string, string> = {}) =>
      total(end.samples, name, match) - (total(before.samples, name, match) || 0);
    const routes = [
      { route: '/api/health', load: health },
      { route: '/api/auth/me', load: me },
    ];
    const targets: Target[] = [];
    for (const { route, load } of routes) {
      const match = { method: 'GET', route, status: '200' };
      const counted = delta('svc_http_requests_total', match);
      const timed = delta('svc_http_request_duration_seconds_count', { method: 'GET', route });
      // autocannon stops with up to one request per connection unanswered; the service may
      // still count those.
      const ok = counted >= load.requests && counted <= load.requests + perRoute;
      check(
        `GET ${route} 200s counted = autocannon's responses (+ at most ${perRoute} cut off)`,
        ok,
        `${counted} counted, ${load.requests} received`,
      );
      check(`GET ${route}: the duration histogram counted each request`, timed === counted, `${timed} timed`);
      // Where the middle falls in autocannon's run is a matter of timing: only the order is checked.
      const upTo = (x: Scrape) => total(x.samples, 'svc_http_requests_total', match) || 0;
      check(
        `GET ${route}: the count never went down (before <= middle <= end)`,
        upTo(before) <= upTo(mid) && upTo(mid) <= upTo(end),
        `${upTo(before)}, ${upTo(mid)}, ${upTo(end)}`,
      );
      check(
        `GET ${route}: autocannon saw no errors`,
        load.errors === 0 && load.non2xx === 0,
        `${load.errors} errors, ${load.non2xx} non-2xx`,
      );
      targets.push({
        what: `GET ${route} requests counted by /metrics`,
        unit: 'requests',
        value: counted,
        baseline: { name: 'autocannon responses', value: load.requests },
        ratio: counted / load.requests,
        goal: `= baseline (+ <= ${perRoute})`,
        met: ok,
      });
    }
    const appended = delta('svc_log_events_appended_total');
    const copied = delta('svc_log_events_copied_total');
    check(
      'svc_log_events_appended_total counted every acknowledged event',
      streamed.acked > 0 && appended >= streamed.acked,
      `${appended} appended, ${streamed.acked} acknowledged to the runner`,
    );
    check('svc_log_events_copied_total grew', copied > 0, `${copied} copied`);
    const limited = delta('svc_rate_limited_total');
    check('svc_rate_limited_total stayed 0 (RATE_LIMIT_PER_MINUTE=0)', limited === 0, String(limited));
    const endWatchers = total(end.samples, 'svc_stream_watchers');
    const endRunners = total(end.samples, 'svc_runner_connections');
    targets.push(
      {
        what: 'SSE watchers reported (svc_stream_watchers)',
        unit: 'watchers',
        value: endWatchers,
        goal: `= ${watchers}`,
        met: endWatchers === watchers,
      },
      {
        what: 'runners reported (svc_runner_connections)',
        unit: 'connections',
        value: endRunners,
        goal: '= 1',
        met: endRunners === 1,
      },
      {
        what: 'events appended (svc_log_events_appended_total)',
        unit: 'events',
        value: appended,
        baseline: { name: 'acknowledged to the runner', value: streamed.acked },
        ratio: appended / streamed.acked,
        goal: '>= baseline',
        met: appended >= streamed.acked,
      },
      {
        what: 'events copied to Postgres (svc_log_events_copied_total)',
        unit: 'events',
        value: copied,
        goal: '> 0',
        met: copied > 0,
      },
    );

    const lines = (s: Scrape) => s.samples.filter(interesting).map((x) => x.line);
    const figures = {
      edgeProcesses: EDGE_PROCESSES,
      watchers,
      autocannonConnectionsPerRoute: perRoute,
      seconds: opts.duration,
      load: {
        'GET /api/health': health,
        'GET /api/auth/me': me,
        runner: { acknowledgedEvents: streamed.acked, frames: streamed.frames, eventsPerFrame: BATCH },
      },
      copyLagSeconds: {
        middle: largest(mid.samples, 'svc_log_copy_lag_seconds'),
        end: largest(end.samples, 'svc_log_copy_lag_seconds'),
      },
      checks,
      scrapes: {
        middle: { atSeconds: Number(mid.at.toFixed(2)), lines: lines(mid) },
        end: { atSeconds: Number(end.at.toFixed(2)), lines: lines(end) },
      },
    };
    const failed = checks.filter((c) => !c.ok);
    for (const c of checks) progress.say(`${c.ok ? 'ok    ' : 'FAILED'} ${c.what}: ${c.detail}`);
    if (failed.length) {
      throw new Error(
        `/metrics disagrees with the load:\n${failed.map((c) => `  ${c.what}: ${c.detail}`).join('\n')}\nend scrape:\n${lines(end).join('\n')}`,
      );
    }
    return {
      figures,
      targets,
      charts: [],
      notes: [
        `Our service with EDGE_PROCESSES=${EDGE_PROCESSES} on a throwaway Redis and PostgreSQL, RATE_LIMIT_PER_MINUTE=0. ${watchers} SSE watchers of one account on /api/events/stream; one runner (real protocol, a load-client process) streaming frames of ${BATCH} stdout lines of ${PAYLOAD_BYTES} bytes, ${WINDOW} unacknowledged; autocannon with ${perRoute} connections each on GET /api/health and GET /api/auth/me (API key) for ${opts.duration} s.`,
        `/metrics was scraped from loopback before the load, ${mid.at.toFixed(1)} s into it and at its end (${end.at.toFixed(1)} s); request and event figures are the difference from the scrape before, summed over edge_process. Every check passed: ${checks.length}.`,
        `autocannon: GET /api/health ${Math.round(health.requestsPerSecond)} req/s (p50 ${health.p50} ms, p99 ${health.p99} ms), GET /api/auth/me ${Math.round(me.requestsPerSecond)} req/s (p50 ${me.p50} ms, p99 ${me.p99} ms).`,
        `Copy lag (svc_log_copy_lag_seconds, the larger of the processes'): ${figures.copyLagSeconds.middle} s in the middle, ${figures.copyLagSeconds.end} s at the end.`,
        "The scrapes' interesting lines are under Figures (scrapes.middle, scrapes.end).",
      ],
      clientCpuSeconds: health.clientCpuSeconds + me.clientCpuSeconds + runner.cpuSeconds() + sse.cpuSeconds(),
    };
  },
};
