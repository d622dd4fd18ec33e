import { existsSync } from 'node:fs';
import { delimiter, join, resolve } from 'node:path';
import { EmbeddedUnavailableError } from '@svc/db';
import { type Config, ConfigError, loadConfig } from './config.ts';
import { createLogger, type Service, startService } from './main.ts';
import { EXIT_IN_USE, InUseError } from './processes/in-use.ts';

/**
 * What SANDBOX_ISOLATION means on this machine: `none`, or namespaces, and then whether the
 * tools it needs are here (each runner-agent checks again, and refuses to build without them).
 */
function isolationLine(config: Config): string {
  if (config.SANDBOX_ISOLATION === 'none')
    return 'isolation none (SANDBOX_ISOLATION=none): sandbox processes run as plain processes of this machine';
  const onPath = (cmd: string) => (process.env.PATH ?? '').split(delimiter).some((d) => d && existsSync(join(d, cmd)));
  const missing = ['bwrap', 'socat'].filter((c) => !onPath(c));
  return missing.length === 0
    ? `isolated in namespaces of their own (bubblewrap${['x64', 'arm64'].includes(process.arch) ? ', with a seccomp filter' : ''})`
    : `cannot be isolated: ${missing.join(' and ')} not installed (apt-get install bubblewrap socat), so none is built; SANDBOX_ISOLATION=none runs them without isolation`;
}

/** What `npm start` prints once the service listens: where it is, what it stores in, what to do next. */
export function startBanner(config: Config, service: Service): string {
  const storage = !config.DATABASE_URL
    ? `embedded PostgreSQL ${service.db.embedded?.version ?? ''} in ${resolve(config.DATA_DIR, 'postgres')}`
    : config.DATABASE_URL === 'memory'
      ? `embedded PostgreSQL ${service.db.embedded?.version ?? ''}, throwaway (DATABASE_URL=memory)`
      : 'Postgres';
  return [
    '',
    `  svc is listening on ${service.url}`,
    `  storage: ${storage}; live log and bus: ${config.REDIS_URL ? (config.REDIS_CLUSTER ? 'Redis Cluster' : 'Redis') : 'in memory'}`,
    `  edge processes: ${config.EDGE_PROCESSES}${config.EDGE_PROCESSES > 1 ? ` on one port (SO_REUSEPORT), pids ${[process.pid, ...(service.edgeProcesses?.pids() ?? [])].join(', ')}` : ''}`,
    `  mail goes to: ${service.mailer.describe}`,
    `  local sandboxes: ${isolationLine(config)}`,
    `  API reference: ${service.url}/api/docs (OpenAPI at ${service.url}/api/openapi.json)`,
    '',
    '  Next: register, then open the verification link from the mail folder:',
    `    curl -X POST ${service.url}/api/auth/register -H 'content-type: application/json' \\`,
    `      -d '{"email":"you@example.com","password":"a long password"}'`,
    '',
  ].join('\n');
}

/**
 * `npm start` (gateway/start.mjs): configuration from the environment (exit 78 when it is
 * wrong), the service (exit 75 when another instance holds DATA_DIR or the port), the banner,
 * and graceful shutdown on SIGINT and SIGTERM.
 */
export async function runFromEnv(): Promise<void> {
  let config: Config;
  try {
    config = loadConfig(process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(78);
    }
    throw err;
  }
  const log = createLogger(config.LOG_LEVEL);
  let service: Service;
  try {
    service = await startService(config, log);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(78);
    }
    if (err instanceof InUseError) {
      process.stderr.write(`svc cannot start: ${err.message}\n`);
      process.exit(EXIT_IN_USE);
    }
    if (err instanceof EmbeddedUnavailableError) {
      // Not a fault of the service: what this machine offers; DATABASE_URL is the way round.
      process.stderr.write(`svc cannot start: ${err.message}\n`);
      process.exit(78);
    }
    log.fatal({ err }, 'could not start');
    process.exit(1);
  }
  process.stdout.write(startBanner(config, service));
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'shutting down: draining requests');
    const timer = setTimeout(() => process.exit(1), config.SHUTDOWN_GRACE_MS + 5000);
    timer.unref();
    await service.close().catch((err) => log.error({ err }, 'shutdown error'));
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
}
