import { randomBytes } from 'node:crypto';
import { get } from 'node:http';
import { networkInterfaces } from 'node:os';
import t from 'tap';
import { parseExposition, type Sample } from '../../bench/src/lib/prometheus.ts';
import { signUp, startTestService, type TestService, transportSetups } from './harness.ts';
import { startRunnerProcess } from './runner-process.ts';
import { rawGet } from './sse-client.ts';
import { until } from './until.ts';

async function scrape(svc: TestService, headers: Record<string, string> = {}) {
  const res = await fetch(`${svc.url}/metrics`, { headers });
  const text = await res.text();
  return { res, text, samples: res.status === 200 ? parseExposition(text) : [] };
}

/** The value of the one sample of `name` whose labels include `labels`; undefined when none. */
function sampleOf(samples: Sample[], name: string, labels: Record<string, string> = {}): number | undefined {
  const found = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  if (found.length > 1) throw new Error(`${found.length} samples of ${name} match ${JSON.stringify(labels)}`);
  return found[0]?.value;
}

for (const { backend, edge } of transportSetups()) {
  t.test(`/metrics on ${backend}, ${edge ? 'behind the edge' : 'Fastify alone'}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      // The copier runs only when the test says, so what is pending is the test's to see.
      env: { EDGE: String(edge), LOG_COPY_INTERVAL_MS: '600000', SSE_IDLE_CLOSE_MS: '0' },
    });
    const me = await signUp(svc);
    const auth = { authorization: `Bearer ${me.key}` };

    t.test('requests are counted by method, route pattern and status, never by raw URL', async (t) => {
      const ids = Array.from({ length: 5 }, () => `cnv_${randomBytes(8).toString('hex')}`);
      const before = (await scrape(svc)).samples;
      const route = { method: 'GET', route: '/api/conversations/:id', status: '404' };
      const was = sampleOf(before, 'svc_http_requests_total', route) ?? 0;
      for (const id of ids) t.equal((await svc.http.get(`/api/conversations/${id}`, { token: me.key })).status, 404);
      const nowhere = `/api/nowhere-${randomBytes(6).toString('hex')}`;
      t.equal((await svc.http.get(nowhere)).status, 404);
      t.equal((await svc.http.get('/api/health')).status, 200);

      const { res, text, samples } = await scrape(svc);
      t.equal(res.status, 200);
      t.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
      t.equal(sampleOf(samples, 'svc_http_requests_total', route), was + 5, 'five ids, one series');
      t.ok(
        (sampleOf(samples, 'svc_http_requests_total', { route: 'unmatched', status: '404' }) ?? 0) >= 1,
        'a path no route matches is counted as unmatched',
      );
      t.ok((sampleOf(samples, 'svc_http_requests_total', { route: '/api/health', status: '200' }) ?? 0) >= 1);
      t.equal(
        sampleOf(samples, 'svc_http_request_duration_seconds_count', {
          method: 'GET',
          route: '/api/conversations/:id',
        }),
        was + 5,
        'each request observed in the duration histogram',
      );
      for (const secret of [...ids, nowhere, me.key, me.accountId]) {
        t.notOk(text.includes(secret), `no label carries ${secret.slice(0, 12)}...`);
      }
      const routes = new Set(samples.flatMap((s) => (s.labels.route ? [s.labels.route] : [])));
      for (const r of routes) t.match(r, /^(unmatched|\/[a-z0-9/_.:-]*)$/, `${r} is a route pattern`);
      for (const s of samples) t.equal(s.labels.edge_process, '0', `${s.name} names its process`);
    });

    t.test('open streams, connected runners and log appends are reported', async (t) => {
      const before = (await scrape(svc)).samples;
      t.equal(sampleOf(before, 'svc_stream_watchers'), 0);
      t.equal(sampleOf(before, 'svc_runner_connections'), 0);
      t.equal(sampleOf(before, 'svc_log_copy_pending_tenants'), 0);

      const watcher = rawGet(svc, '/api/events/stream', auth);
      t.teardown(() => watcher.sock.destroy());
      await until(
        'the stream to open',
        async () => (watcher.text().includes(': connected') ? true : undefined),
        10_000,
      );
      const created = await svc.http.post('/api/runners', { token: me.key, body: { name: 'metrics box' } });
      await startRunnerProcess(t, svc.url, created.body.token);
      await until(
        'the runner to be counted',
        async () => (sampleOf((await scrape(svc)).samples, 'svc_runner_connections') === 1 ? true : undefined),
        10_000,
      );
      // The connection's own `team` event (through the outbox) is appended and copied before
      // the counts are read, so they move by the three events below alone.
      await svc.launch.relay.flush(me.accountId);
      await svc.copier.pass();
      const settled = (await scrape(svc)).samples;
      const appendedBefore = sampleOf(settled, 'svc_log_events_appended_total') ?? 0;
      const copiedBefore = sampleOf(settled, 'svc_log_events_copied_total') ?? 0;

      await svc.appendEvents({
        tenant: me.accountId,
        producer: 'metrics-test',
        seq: 1,
        events: [1, 2, 3].map((i) => ({
          conversationId: 'cnv_metrics',
          kind: 'output',
          stream: 'stdout',
          data: `${i}`,
        })),
      });
      const during = (await scrape(svc)).samples;
      t.equal(sampleOf(during, 'svc_stream_watchers'), 1, 'the open stream');
      t.equal(sampleOf(during, 'svc_log_events_appended_total'), appendedBefore + 3, 'three events appended');
      t.equal(sampleOf(during, 'svc_log_copy_pending_tenants'), 1, 'one tenant not copied yet');
      t.ok((sampleOf(during, 'svc_log_copy_lag_seconds') ?? -1) >= 0, 'the copy lag is reported');

      await svc.copier.pass();
      const after = (await scrape(svc)).samples;
      t.equal(sampleOf(after, 'svc_log_copy_pending_tenants'), 0, 'copied');
      t.equal(sampleOf(after, 'svc_log_copy_lag_seconds'), 0, 'no lag once everything is copied');
      t.equal(sampleOf(after, 'svc_log_events_copied_total'), copiedBefore + 3, 'the three events copied');

      watcher.sock.destroy();
      await until(
        'the stream to be gone',
        async () => (sampleOf((await scrape(svc)).samples, 'svc_stream_watchers') === 0 ? true : undefined),
        10_000,
      );
    });
  });
}

/** An address of this machine other than loopback, to reach the service as a remote client. */
function outsideAddress(): string | undefined {
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  }
  return undefined;
}

for (const edge of [true, false]) {
  t.test(
    `/metrics from another host needs METRICS_TOKEN (${edge ? 'edge' : 'Fastify alone'})`,
    { skip: !outsideAddress() && 'no address besides loopback' },
    async (t) => {
      const token = randomBytes(24).toString('hex');
      const addr = outsideAddress() as string;
      const withToken = await startTestService(t, {
        backend: 'embedded',
        env: { EDGE: String(edge), HOST: '0.0.0.0', METRICS_TOKEN: token },
      });
      const remote = `http://${addr}:${withToken.port}/metrics`;
      const bare = await fetch(remote);
      t.equal(bare.status, 401);
      t.match(await bare.json(), { error: 'unauthorized', message: /METRICS_TOKEN/ });
      const wrong = await fetch(remote, { headers: { authorization: `Bearer ${token}x` } });
      t.equal(wrong.status, 401);
      await wrong.body?.cancel();
      const right = await fetch(remote, { headers: { authorization: `Bearer ${token}` } });
      t.equal(right.status, 200);
      t.match(await right.text(), /^# HELP svc_/m);
      const local = await fetch(`http://127.0.0.1:${withToken.port}/metrics`);
      t.equal(local.status, 200, 'loopback needs no token');
      await local.body?.cancel();

      const without = await startTestService(t, { backend: 'embedded', env: { EDGE: String(edge), HOST: '0.0.0.0' } });
      const refused = await fetch(`http://${addr}:${without.port}/metrics`);
      t.equal(refused.status, 403);
      t.match(await refused.json(), { error: 'forbidden', message: /loopback/ });
    },
  );
}

/** A GET on a connection of its own (no keep-alive), so the kernel picks its process afresh. */
function getAlone(url: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    get(url, { agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        text += d;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    }).on('error', reject);
  });
}

t.test(
  'with EDGE_PROCESSES=3, a scrape landing on any process shows the series of all three',
  { skip: !process.env.TEST_REDIS_URL && 'needs Redis and Postgres' },
  async (t) => {
    const svc = await startTestService(t, { backend: 'postgres+redis', env: { EDGE_PROCESSES: '3' } });
    for (let i = 0; i < 30; i++) t.equal((await getAlone(`${svc.url}/api/health`)).status, 200);
    for (let i = 0; i < 12; i++) {
      const { status, text } = await getAlone(`${svc.url}/metrics`);
      t.equal(status, 200);
      const samples = parseExposition(text);
      const started = samples.filter((s) => s.name === 'svc_process_start_time_seconds');
      t.same(started.map((s) => s.labels.edge_process).sort(), ['0', '1', '2'], `scrape ${i}: each process once`);
      const health = samples
        .filter((s) => s.name === 'svc_http_requests_total' && s.labels.route === '/api/health')
        .reduce((sum, s) => sum + s.value, 0);
      t.equal(health, 30, `scrape ${i}: the health checks of every process add up`);
    }
  },
);

for (const edge of [true, false]) {
  t.test(`requests the rate limit refuses are counted (${edge ? 'edge' : 'Fastify alone'})`, async (t) => {
    const svc = await startTestService(t, {
      backend: 'embedded',
      env: { EDGE: String(edge), RATE_LIMIT_PER_MINUTE: '3' },
    });
    let refused = 0;
    for (let i = 0; i < 8; i++) {
      const res = await getAlone(`${svc.url}/api/health`);
      if (res.status === 429) refused++;
    }
    t.ok(refused >= 4, `${refused} of 8 refused`);
    const { status, text } = await getAlone(`${svc.url}/metrics`);
    t.equal(status, 200, '/metrics is outside /api, so never rate limited');
    t.equal(sampleOf(parseExposition(text), 'svc_rate_limited_total'), refused);
  });
}
