import { pendingMigrations, ping, type Sql } from '@svc/db';

export interface ReadinessDeps {
  sql: Sql;
  /** Pings the Redis this process uses; undefined when it runs on the in-memory log (embedded). */
  pingRedis: (() => Promise<unknown>) | undefined;
  /** How long each check may take before it counts as failed. */
  timeoutMs: number;
}

export type DatabaseCheck = 'ok' | 'unreachable';
export type RedisCheck = 'ok' | 'unreachable' | 'not_configured';
/** `unknown` when the database could not be asked. */
export type MigrationsCheck = 'ok' | 'pending' | 'unknown';

export interface Readiness {
  ready: boolean;
  checks: { database: DatabaseCheck; redis: RedisCheck; migrations: MigrationsCheck };
}

/** Resolves with `work`'s outcome, or rejects once `ms` have passed (a dependency that hangs). */
function within<T>(ms: number, work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}

/**
 * Whether this process can do its work now: the database answers, Redis answers (when
 * configured), and every migration file is applied. Checks run at once, each bounded by
 * `timeoutMs`, so a hung dependency makes the answer "not ready", never a hung probe. Never
 * throws; reports only fixed words, no addresses or driver messages.
 */
export async function checkReadiness(deps: ReadinessDeps): Promise<Readiness> {
  const { sql, pingRedis, timeoutMs } = deps;
  const [database, migrations, redis] = await Promise.all([
    within(timeoutMs, ping(sql)).then(
      (): DatabaseCheck => 'ok',
      (): DatabaseCheck => 'unreachable',
    ),
    within(timeoutMs, pendingMigrations(sql)).then(
      (pending): MigrationsCheck => (pending.length ? 'pending' : 'ok'),
      (): MigrationsCheck => 'unknown',
    ),
    pingRedis
      ? within(timeoutMs, pingRedis()).then(
          (): RedisCheck => 'ok',
          (): RedisCheck => 'unreachable',
        )
      : Promise.resolve<RedisCheck>('not_configured'),
  ]);
  const ready = database === 'ok' && migrations === 'ok' && redis !== 'unreachable';
  return { ready, checks: { database, redis, migrations } };
}
