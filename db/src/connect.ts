import { mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import postgres from 'postgres';

export type Sql = postgres.Sql;

export interface Database {
  sql: Sql;
  /** `postgres` for a real server, `pglite` for the embedded one. */
  kind: 'postgres' | 'pglite';
  /**
   * Whether `sql.listen` can receive notifications. PGlite cannot: its socket server takes one
   * connection (a second one, which LISTEN needs, is dropped before its first byte: `write
   * EPIPE`), and it streams a query's output to the socket that sent it without reading it,
   * so a NOTIFY never reaches another connection nor PGlite's own listeners. Embedded runs in
   * one process, so a waker in that process and a periodic sweep do the job instead.
   */
  notifications: boolean;
  close(): Promise<void>;
}

export interface OpenOptions {
  /** A postgres:// URL; `memory` for a throwaway embedded database; unset for embedded on disk. */
  url: string | undefined;
  /** Where the embedded database keeps its files (`<dataDir>/pglite`). */
  dataDir: string;
  /** Pool size for a real server. The embedded server is always one connection. */
  max?: number;
  onNotice?: (notice: unknown) => void;
}

/**
 * Opens the system of record. With a URL, a postgres.js pool against that server. Without one,
 * PGlite (Postgres compiled to WASM) served on a private Unix socket through
 * `@electric-sql/pglite-socket`, so the same driver and the same SQL run in both cases.
 * PGlite runs every query through one queue and keeps an open transaction's connection
 * exclusive, so the embedded pool is one connection: a transaction never waits on another.
 */
export async function openDatabase(options: OpenOptions): Promise<Database> {
  const common = {
    onnotice: options.onNotice ?? (() => {}),
    transform: { undefined: null },
    connection: { application_name: 'svc' },
  } as const;
  if (options.url && options.url !== 'memory') {
    const sql = postgres(options.url, { ...common, max: options.max ?? 10 });
    return { sql, kind: 'postgres', notifications: true, close: () => sql.end({ timeout: 5 }) };
  }

  const { PGlite } = await import('@electric-sql/pglite');
  // Extensions the migrations create must be bundled into the instance when it starts.
  const { btree_gin } = await import('@electric-sql/pglite/contrib/btree_gin');
  const { PGLiteSocketServer } = await import('@electric-sql/pglite-socket');
  const memory = options.url === 'memory';
  let dataPath: string | undefined;
  if (!memory) {
    dataPath = join(options.dataDir, 'pglite');
    await mkdir(dataPath, { recursive: true });
  }
  const db = await PGlite.create(dataPath, { extensions: { btree_gin } });
  // Socket paths are limited to ~107 bytes, so the socket lives in the temp dir.
  const socketDir = join(tmpdir(), `svc-pglite-${process.pid}-${Math.random().toString(36).slice(2, 8)}`);
  await mkdir(socketDir, { recursive: true });
  const socketPath = join(socketDir, '.s.PGSQL.5432');
  const server = new PGLiteSocketServer({ db, path: socketPath, maxConnections: 1 });
  await server.start();
  const sql = postgres({
    ...common,
    host: socketDir,
    port: 5432,
    path: socketPath,
    database: 'postgres',
    username: 'postgres',
    max: 1,
    // PGlite answers no cancel requests and knows no prepared-statement cache limits.
    prepare: false,
  });
  return {
    sql,
    kind: 'pglite',
    notifications: false,
    async close() {
      await sql.end({ timeout: 5 });
      await server.stop();
      await db.close();
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
