/**
 * An edge process other than the first (see supervisor.ts): forked by the primary, it waits for
 * its configuration over IPC (so MASTER_KEY never sits in its environment), runs the whole
 * service on the primary's port, and answers `ready` or `failed`. It stops on SIGTERM (sent by
 * the primary's close) and when the primary goes away; SIGINT from a terminal is the primary's
 * to act on, since it reaches the whole process group.
 */
import { createLogger, type Service, startService } from '../main.ts';
import type { FromChild, ToChild } from './supervisor.ts';

let service: Service | undefined;
let stopping: Promise<never> | undefined;

const tell = (m: FromChild) => process.send?.(m);

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
  startService(m.config, log, { joinsGroupPort: true }).then(
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
