import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type postgres from 'postgres';

type Sql = postgres.Sql;

const MIGRATIONS_DIR = fileURLToPath(new URL('../migrations/', import.meta.url));

/** Arbitrary but fixed: the advisory lock every starting process takes before migrating. */
const MIGRATION_LOCK = 7_240_113;

/**
 * Applies every `migrations/NNN_name.sql` not yet recorded in `schema_migrations`, in name
 * order, each in its own transaction, while holding a session advisory lock: two processes
 * starting at once serialise here, and the second finds nothing left to do.
 * Returns the names it applied.
 */
export async function migrate(sql: Sql): Promise<string[]> {
  const files = (await readdir(MIGRATIONS_DIR)).filter((f) => f.endsWith('.sql')).sort();
  const applied: string[] = [];
  await sql.reserve().then(async (conn) => {
    try {
      await conn`SELECT pg_advisory_lock(${MIGRATION_LOCK})`;
      await conn`CREATE TABLE IF NOT EXISTS schema_migrations (
        name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`;
      const done = new Set((await conn<{ name: string }[]>`SELECT name FROM schema_migrations`).map((r) => r.name));
      for (const file of files) {
        if (done.has(file)) continue;
        const text = await readFile(MIGRATIONS_DIR + file, 'utf8');
        await conn.unsafe('BEGIN');
        try {
          await conn.unsafe(text);
          await conn`INSERT INTO schema_migrations (name) VALUES (${file})`;
          await conn.unsafe('COMMIT');
        } catch (err) {
          await conn.unsafe('ROLLBACK');
          throw new Error(`migration ${file} failed: ${(err as Error).message}`, { cause: err });
        }
        applied.push(file);
      }
    } finally {
      await conn`SELECT pg_advisory_unlock(${MIGRATION_LOCK})`.catch(() => {});
      conn.release();
    }
  });
  return applied;
}

/**
 * Migration files not recorded as applied in `schema_migrations` (all of them when the table
 * does not exist yet): what readiness reports. Reads only; takes no lock.
 */
export async function pendingMigrations(sql: Sql): Promise<string[]> {
  const files = (await readdir(MIGRATIONS_DIR)).filter((f) => f.endsWith('.sql')).sort();
  const [table] = await sql<{ exists: boolean }[]>`SELECT to_regclass('schema_migrations') IS NOT NULL AS exists`;
  if (!table?.exists) return files;
  const done = new Set((await sql<{ name: string }[]>`SELECT name FROM schema_migrations`).map((r) => r.name));
  return files.filter((f) => !done.has(f));
}

/** A digest of every migration's name and text: what a database migrated from them holds. */
export async function migrationsDigest(): Promise<string> {
  const hash = createHash('sha256');
  for (const file of (await readdir(MIGRATIONS_DIR)).filter((f) => f.endsWith('.sql')).sort()) {
    hash.update(`${file}\0${await readFile(MIGRATIONS_DIR + file, 'utf8')}\0`);
  }
  return hash.digest('hex');
}
