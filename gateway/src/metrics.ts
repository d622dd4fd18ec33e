import { AggregatorRegistry, Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

/**
 * What the api role reports per answered request. `route` is the matched route pattern
 * (`/api/conversations/:id`), never the raw URL, or undefined when no route matched.
 */
export interface RequestMetrics {
  requestDone(method: string, route: string | undefined, status: number, seconds: number): void;
}

/** What the rate limit reports per request it refuses. */
export interface AdmissionMetrics {
  rateLimited(): void;
}

/** What the scheduler reports per run it fires: `started` when the run began, else `failed`. */
export interface SchedulerMetrics {
  scheduleRun(outcome: 'started' | 'failed'): void;
}

/** What the log's write path reports per append, counted as it happens (one add, no I/O). */
export interface AppendMetrics {
  appended(events: number): void;
}

/**
 * Figures read at scrape time, so the hot paths keep no gauges up to date: each is called once
 * per scrape and must be cheap and synchronous.
 */
export interface ScrapeSources {
  /** Open SSE streams on this process. */
  watchers(): number;
  /** Runners connected to this process (hello received). */
  runners(): number;
  /** Events this process's log copier has stored in Postgres since it started. */
  copied(): number;
  /** Seconds since the oldest event appended on this process and not yet copied; 0 when none. */
  copyLagSeconds(): number;
  /** Tenants with appended events that this process's copier has not copied yet. */
  copyPendingTenants(): number;
}

/** One process's metrics as prom-client hands them between processes (JSON, over IPC). */
export type MetricsSnapshot = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;

/** The methods Fastify routes; anything else is counted as `OTHER`, so the label stays bounded. */
const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);

/**
 * The Prometheus registry of one process and every metric it exposes (`GET /metrics`). Every
 * series carries `edge_process` (0 for the process started first, 1.. for the others of
 * EDGE_PROCESSES), so the series of processes sharing a port never merge. Labels are bounded:
 * method, route pattern, status; no ids, accounts or tokens. With several processes on one
 * port, a scrape lands on any of them and answers with the series of all (`gatherWith`).
 */
export class ServiceMetrics implements RequestMetrics, AppendMetrics, AdmissionMetrics, SchedulerMetrics {
  readonly registry = new Registry();
  private readonly requests: Counter<'method' | 'route' | 'status'>;
  private readonly durations: Histogram<'method' | 'route'>;
  private readonly appends: Counter;
  private readonly refusals: Counter;
  private readonly scheduleRuns: Counter<'outcome'>;
  private gather: (() => Promise<MetricsSnapshot[]>) | undefined;

  constructor(options: { edgeProcess: number }) {
    const registers = [this.registry];
    this.registry.setDefaultLabels({ edge_process: String(options.edgeProcess) });
    collectDefaultMetrics({ register: this.registry, prefix: 'svc_' });
    this.requests = new Counter({
      name: 'svc_http_requests_total',
      help: 'Requests answered by the api role, by method, route pattern and status.',
      labelNames: ['method', 'route', 'status'],
      registers,
    });
    this.durations = new Histogram({
      name: 'svc_http_request_duration_seconds',
      help: 'Time the api role took to answer a request, by method and route pattern.',
      labelNames: ['method', 'route'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.appends = new Counter({
      name: 'svc_log_events_appended_total',
      help: 'Events appended to the event log by this process (after redaction; duplicates not counted).',
      registers,
    });
    this.refusals = new Counter({
      name: 'svc_rate_limited_total',
      help: 'Requests under /api refused 429 rate_limited by this process, whichever server answered.',
      registers,
    });
    this.scheduleRuns = new Counter({
      name: 'svc_schedule_runs_total',
      help: "Schedule runs this process's scheduler fired, by outcome: started, or failed (last_error stamped).",
      labelNames: ['outcome'],
      registers,
    });
  }

  requestDone(method: string, route: string | undefined, status: number, seconds: number): void {
    const m = METHODS.has(method) ? method : 'OTHER';
    const r = route ?? 'unmatched';
    this.requests.inc({ method: m, route: r, status: String(status) });
    this.durations.observe({ method: m, route: r }, seconds);
  }

  appended(events: number): void {
    this.appends.inc(events);
  }

  rateLimited(): void {
    this.refusals.inc();
  }

  scheduleRun(outcome: 'started' | 'failed'): void {
    this.scheduleRuns.inc({ outcome });
  }

  /** Registers the gauges read from `sources` at each scrape. Called once, by the composition root. */
  observe(sources: ScrapeSources): void {
    const registers = [this.registry];
    const gauge = (name: string, help: string, read: () => number) =>
      new Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(read());
        },
      });
    gauge('svc_stream_watchers', 'Open Server-Sent Event streams on this process.', sources.watchers);
    gauge('svc_runner_connections', 'Runners connected to this process.', sources.runners);
    gauge(
      'svc_log_copy_lag_seconds',
      'Age of the oldest event appended here and not yet copied to Postgres; 0 when all is copied.',
      sources.copyLagSeconds,
    );
    gauge(
      'svc_log_copy_pending_tenants',
      'Tenants with events appended here and not yet copied to Postgres.',
      sources.copyPendingTenants,
    );
    // The copier keeps its own total; the counter takes the difference at each scrape.
    let seen = 0;
    new Counter({
      name: 'svc_log_events_copied_total',
      help: 'Events this process has copied from the hot log to Postgres.',
      registers,
      collect() {
        const total = sources.copied();
        if (total > seen) this.inc(total - seen);
        seen = total;
      },
    });
  }

  /**
   * Scrapes answer with what `gather` returns (every process's snapshot, this one's included)
   * instead of this process's series alone.
   */
  gatherWith(gather: () => Promise<MetricsSnapshot[]>): void {
    this.gather = gather;
  }

  /** This process's series, default labels included. */
  snapshot(): Promise<MetricsSnapshot> {
    return this.registry.getMetricsAsJSON();
  }

  /** The text exposition of every metric, and its content type. */
  async scrape(): Promise<{ contentType: string; body: string }> {
    if (!this.gather) return { contentType: this.registry.contentType, body: await this.registry.metrics() };
    const snapshots = await this.gather();
    // Each process's series differ by edge_process, so summing merges nothing: it lists them
    // all. (The default aggregators would keep one process's version and start time, or none.)
    for (const metric of snapshots.flat()) metric.aggregator = 'sum';
    const merged = AggregatorRegistry.aggregate(snapshots);
    return { contentType: merged.contentType, body: await merged.metrics() };
  }
}
