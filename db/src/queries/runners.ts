import type { Sql } from '../connect.ts';

export interface RunnerRow {
  id: string;
  account_id: string;
  name: string;
  token_prefix: string;
  /** The owner's own machine (`self`), or a runner-agent the `local` provider started. */
  kind: 'self' | 'local';
  hostname: string | null;
  path: string | null;
  version: string | null;
  instance: string | null;
  epoch: number;
  connected: boolean;
  last_seen_at: Date | null;
  created_at: Date;
}

const columns = (sql: Sql) =>
  sql`id, account_id, name, token_prefix, kind, hostname, path, version, instance, epoch, connected, last_seen_at, created_at`;

export async function insertRunner(
  sql: Sql,
  r: { id: string; accountId: string; name: string; tokenHash: Buffer; tokenPrefix: string; kind?: 'self' | 'local' },
): Promise<RunnerRow> {
  const rows = await sql<RunnerRow[]>`
    INSERT INTO runners (id, account_id, name, token_hash, token_prefix, kind)
    VALUES (${r.id}, ${r.accountId}, ${r.name}, ${r.tokenHash}, ${r.tokenPrefix}, ${r.kind ?? 'self'})
    RETURNING ${columns(sql)}`;
  return rows[0] as RunnerRow;
}

/** The owner's runners (not those the instance starts for local sandboxes). */
export async function listRunners(sql: Sql, accountId: string): Promise<RunnerRow[]> {
  return sql<RunnerRow[]>`SELECT ${columns(sql)} FROM runners
                          WHERE account_id = ${accountId} AND kind = 'self' ORDER BY created_at, id`;
}

export async function getRunner(sql: Sql, accountId: string, id: string): Promise<RunnerRow | undefined> {
  const rows = await sql<
    RunnerRow[]
  >`SELECT ${columns(sql)} FROM runners WHERE account_id = ${accountId} AND id = ${id} AND kind = 'self'`;
  return rows[0];
}

/** A runner by id alone (the sandbox that names it already belongs to the tenant). */
export async function getRunnerById(sql: Sql, id: string): Promise<RunnerRow | undefined> {
  const rows = await sql<RunnerRow[]>`SELECT ${columns(sql)} FROM runners WHERE id = ${id}`;
  return rows[0];
}

/** A runner the instance started for a local sandbox goes with it. */
export async function deleteLocalRunner(sql: Sql, id: string): Promise<void> {
  await sql`DELETE FROM runners WHERE id = ${id} AND kind = 'local'`;
}

/** The runner a token belongs to; none while its account is suspended (the upgrade is 401). */
export async function findByTokenHash(sql: Sql, tokenHash: Buffer): Promise<RunnerRow | undefined> {
  const rows = await sql<RunnerRow[]>`SELECT ${columns(sql)} FROM runners WHERE token_hash = ${tokenHash}
    AND NOT EXISTS (SELECT 1 FROM accounts a WHERE a.id = runners.account_id AND a.suspended)`;
  return rows[0];
}

/** Deletes the owner's runner; returns whether it was recorded connected, undefined when there is none. */
export async function deleteRunner(
  sql: Sql,
  accountId: string,
  id: string,
): Promise<{ connected: boolean } | undefined> {
  const rows = await sql<{ connected: boolean }[]>`
    DELETE FROM runners WHERE account_id = ${accountId} AND id = ${id} AND kind = 'self' RETURNING connected`;
  return rows[0];
}

/**
 * A change of a runner's connection, as recorded: the connection's epoch, whose runner it is,
 * and whether it is the owner's own machine (`self`) or one the instance started (`local`).
 */
export interface ConnectionChange {
  epoch: number;
  account_id: string;
  kind: 'self' | 'local';
}

/** The live connection of another process that keeps a runner's token (see `connected`). */
export interface TokenTaken {
  taken: { hostname: string | null; instance: string | null };
}

/**
 * Records an accepted connection with a new epoch (one more than the last). Refused, with
 * who holds it, while another process's connection is recorded connected and was heard from
 * within `liveWithinMs`: the token serves one machine, and the one connected keeps it. Inside
 * a transaction (the row is locked).
 */
export async function connected(
  sql: Sql,
  id: string,
  hello: { hostname: string; path: string; version: string; instance: string },
  liveWithinMs: number,
): Promise<ConnectionChange | TokenTaken | undefined> {
  const [held] = await sql<{ hostname: string | null; instance: string | null }[]>`
    SELECT hostname, instance FROM runners
    WHERE id = ${id} AND connected AND instance IS DISTINCT FROM ${hello.instance}
      AND last_seen_at > now() - make_interval(secs => ${liveWithinMs / 1000})
    FOR UPDATE`;
  if (held) return { taken: held };
  const rows = await sql<ConnectionChange[]>`
    UPDATE runners SET hostname = ${hello.hostname}, path = ${hello.path}, version = ${hello.version},
      instance = ${hello.instance}, epoch = epoch + 1, connected = true, last_seen_at = now()
    WHERE id = ${id} RETURNING epoch, account_id, kind`;
  return rows[0];
}

/**
 * A heartbeat of the connection `epoch`: recorded when that connection is still the runner's
 * newest. Returns the runner's current epoch and whether it is recorded connected (undefined
 * when the runner was deleted), so a node holding a replaced or deleted runner's connection
 * learns it and closes it, and so does one whose connection was recorded gone meanwhile.
 */
export async function seen(
  sql: Sql,
  id: string,
  epoch: number,
): Promise<{ epoch: number; connected: boolean } | undefined> {
  const rows = await sql<{ epoch: number; connected: boolean }[]>`
    UPDATE runners SET last_seen_at = CASE WHEN epoch = ${epoch} AND connected THEN now() ELSE last_seen_at END
    WHERE id = ${id} RETURNING epoch, connected`;
  return rows[0];
}

/**
 * The connection `epoch` ended: compare-and-set on that epoch while it is recorded connected,
 * so a newer connection that took over stays connected and an end recorded twice (by its node
 * and by a presence sweep) changes the row once. With `silentForMs`, only while the connection
 * has not been heard from for that long (a heartbeat recorded meanwhile keeps it). Returns the
 * change when this call made it, else undefined.
 */
export async function disconnected(
  sql: Sql,
  id: string,
  epoch: number,
  opts: { silentForMs?: number } = {},
): Promise<ConnectionChange | undefined> {
  const silent =
    opts.silentForMs === undefined
      ? sql``
      : sql`AND last_seen_at < now() - ${opts.silentForMs}::integer * interval '1 millisecond'`;
  const rows = await sql<ConnectionChange[]>`
    UPDATE runners SET connected = false, last_seen_at = now()
    WHERE id = ${id} AND epoch = ${epoch} AND connected ${silent}
    RETURNING epoch, account_id, kind`;
  return rows[0];
}

/**
 * Runners recorded connected that no heartbeat reached for `silentForMs` (their node died
 * with the connection, or never noticed it end), oldest first, with the epoch each was seen at.
 */
export async function silentSince(
  sql: Sql,
  silentForMs: number,
  limit: number,
): Promise<{ id: string; epoch: number }[]> {
  return sql<{ id: string; epoch: number }[]>`
    SELECT id, epoch FROM runners
    WHERE connected AND last_seen_at < now() - ${silentForMs}::integer * interval '1 millisecond'
    ORDER BY last_seen_at LIMIT ${limit}`;
}

/** Whether the runner holds a connection newer than `epoch` (it came back, maybe through another node). */
export async function reconnectedSince(sql: Sql, id: string, epoch: number): Promise<boolean> {
  const rows = await sql<
    { ok: boolean }[]
  >`SELECT (connected AND epoch > ${epoch}) AS ok FROM runners WHERE id = ${id}`;
  return rows[0]?.ok ?? false;
}
