/**
 * An edge process other than the first (see supervisor.ts): forked by the primary, it waits for
 * its configuration over IPC (so MASTER_KEY never sits in its environment), runs the whole
 * service on the primary's port, and answers `ready` or `failed`. It stops on SIGTERM (sent by
 * the primary's close) and when the primary goes away; SIGINT from a terminal is the primary's
 * to act on, since it reaches the whole process group.
 */
import { createLogger, type Service, startService } from '../main.ts';
import type { MetricsSnapshot } from '../metrics.ts';
import { type FromChild, METRICS_GATHER_TIMEOUT_MS, type ToChild } from './supervisor.ts';

let service: Service | undefined;
let stopping: Promise<never> | undefined;

const tell = (m: FromChild) => process.send?.(m);

let nextGather = 0;
const gathering = new Map<number, (snapshots: MetricsSnapshot[] | undefined) => void>();

/**
 * Every process's metrics, as the primary gathers them; this process's alone when the primary
 * does not answer in time.
 */
function gatherMetrics(): Promise<MetricsSnapshot[]> {
  return new Promise((resolve, reject) => {
    const id = ++nextGather;
    const settle = (snapshots: MetricsSnapshot[] | undefined) => {
      clearTimeout(timer);
      gathering.delete(id);
      if (snapshots) resolve(snapshots);
      else if (service) service.metrics.snapshot().then((own) => resolve([own]), reject);
      else reject(new Error('not started'));
    };
    // The primary waits up to the same time for each child, so give it a little longer.
    const timer = setTimeout(() => settle(undefined), METRICS_GATHER_TIMEOUT_MS + 500);
    gathering.set(id, settle);
    tell({ type: 'gather-metrics', id });
  });
}

process.on('message', (m: ToChild) => {
  if (m.type === 'metrics') {
    service?.metrics.snapshot().then(
      (snapshot) => tell({ type: 'metrics', id: m.id, snapshot }),
      () => {},
    );
  } else if (m.type === 'metrics-all') gathering.get(m.id)?.(m.snapshots);
});

/** Closes the service (once, whoever asks first) and exits. */
function stop(code: number): Promise<never> {
  stopping ??= (async () => {
    await service?.close().catch(() => {});
    process.exit(code);
  })();
  return stopping;
}

process.on('SIGTERM', () => void stop(0));
process.on('SIGINT', () => {});
process.on('disconnect', () => void stop(0));

process.once('message', (m: ToChild) => {
  if (m.type !== 'start') return;
  const log = createLogger(m.config.LOG_LEVEL).child({ edgeProcess: m.index });
  startService(m.config, log, { edgeProcess: m.index, gatherMetrics, joinsGroupPort: true }).then(
    (started) => {
      service = started;
      tell({ type: 'ready', port: started.port });
    },
    (err: Error) => {
      log.error({ err }, 'edge process could not start');
      tell({ type: 'failed', message: err.message });
      void stop(1);
    },
  );
});
