import { join } from 'node:path';
import postgres from 'postgres';
import { connectionOptions, type EmbeddedLog, type EmbeddedServer, startEmbedded } from './embedded.ts';

export type Sql = postgres.Sql;

/** Seconds after which an idle connection to the embedded server is closed. */
const EMBEDDED_IDLE_TIMEOUT_S = 30;

export interface Database {
  sql: Sql;
  /** `postgres` for a server named by URL, `embedded` for the one this process runs. */
  kind: 'postgres' | 'embedded';
  /** The embedded server, when this process runs one. */
  embedded?: EmbeddedServer;
  close(): Promise<void>;
}

export interface OpenOptions {
  /** A postgres:// URL; `memory` for a throwaway embedded database; unset for embedded on disk. */
  url: string | undefined;
  /** Where the embedded database keeps its cluster (`<dataDir>/postgres`). */
  dataDir: string;
  /** Pool size. */
  max?: number;
  onNotice?: (notice: unknown) => void;
  /** Where the embedded server's warnings, errors and unasked exit are told. */
  log?: EmbeddedLog;
}

/**
 * Opens the system of record: a postgres.js pool against the server the URL names, or against
 * the embedded PostgreSQL this process starts (`./embedded.ts`) when there is no URL (its
 * cluster in `<dataDir>/postgres`) or the URL is `memory` (a throwaway cluster, already
 * migrated). The same driver, SQL and pool run in every case.
 */
export async function openDatabase(options: OpenOptions): Promise<Database> {
  const common = {
    onnotice: options.onNotice ?? (() => {}),
    transform: { undefined: null },
    connection: { application_name: 'svc' },
    max: options.max ?? 10,
  } as const;
  if (options.url && options.url !== 'memory') {
    const sql = postgres(options.url, common);
    return { sql, kind: 'postgres', close: () => sql.end({ timeout: 5 }) };
  }
  const embedded = await startEmbedded({
    ...(options.url === 'memory' ? {} : { dir: join(options.dataDir, 'postgres') }),
    // Room for the pool, the outbox relay's LISTEN connection and a few sessions of one's own.
    settings: { max_connections: String(Math.max(60, common.max + 20)) },
    ...(options.log ? { log: options.log } : {}),
  });
  // Each backend of the embedded server holds about 14 MB of its own: connections idle for a
  // while are closed, so an idle service goes back to its small footprint.
  const sql = postgres({ ...common, ...connectionOptions(embedded.socketDir), idle_timeout: EMBEDDED_IDLE_TIMEOUT_S });
  return {
    sql,
    kind: 'embedded',
    embedded,
    async close() {
      await sql.end({ timeout: 5 });
      await embedded.stop();
    },
  };
}

/**
 * Runs `fn` in a transaction: inside the caller's when `sql` already is one (a query function
 * called from a service's transaction), else in a new one.
 */
export function transaction<T>(sql: Sql, fn: (tx: Sql) => Promise<T>): Promise<T> {
  if (typeof (sql as unknown as { savepoint?: unknown }).savepoint === 'function') return fn(sql);
  return sql.begin((tx) => fn(tx as unknown as Sql)) as Promise<T>;
}

/** Resolves once the database answers a trivial query (readiness); rejects when it cannot. */
export async function ping(sql: Sql): Promise<void> {
  await sql`SELECT 1`;
}
