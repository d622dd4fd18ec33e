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
    // At most one query waits behind the running one on a connection; postgres.js pipelines up
    // to 100 by default (`max_pipeline`, read by its options parser though not in its types).
    // Under sustained load the default made the pool slower the longer the load lasted: a query
    // handed to an already busy connection takes it from the pool's queue of busy connections
    // (`src/queue.js`), whose `shift` leaves an empty slot behind and which is reset only once
    // it runs empty; the connection, still busy, is pushed back, and every later move of a
    // connection searches that whole array, holes included, with `indexOf`. With one query
    // waiting, a connection that takes one more is full and leaves that queue, so it keeps
    // emptying. Measured with 50 concurrent `SELECT 1` loops on 10 connections: the default fell
    // from about 22,000 queries/s in its first seconds to 8,000 within 20 s; one waiting held
    // 31,000 to 44,000. On the service, `GET /api/agents` at 50 connections: 17% more requests/s
    // and 15% less CPU per request (four interleaved rounds of 8 s).
    const pipelining: object = { max_pipeline: 1 };
    const sql = postgres(options.url, { ...common, max: options.max ?? 10, ...pipelining });
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
