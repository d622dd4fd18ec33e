import type postgres from 'postgres';
import type { Sql } from '../connect.ts';

/** A preset's name, or a header and a format of one's own (see @svc/core `bindingHeader`). */
export type BindingShapeValue = string | { header: string; format: string };

export interface BindingRow {
  id: string;
  account_id: string;
  secret_name: string;
  host: string;
  shape: BindingShapeValue;
  created_at: Date;
  updated_at: Date;
}

/** Whether `err` is a second binding of one (account, secret name, host). */
function isNameHostTaken(err: unknown): boolean {
  const e = err as { code?: string; constraint_name?: string };
  return e.code === '23505' && e.constraint_name === 'secret_bindings_name_host_key';
}

/** Inserts; 'conflict' when the account already binds that secret name to that host. */
export async function insertBinding(
  sql: Sql,
  b: { id: string; accountId: string; secretName: string; host: string; shape: BindingShapeValue },
): Promise<BindingRow | 'conflict'> {
  const rows = await sql<BindingRow[]>`
    INSERT INTO secret_bindings (id, account_id, secret_name, host, shape)
    VALUES (${b.id}, ${b.accountId}, ${b.secretName}, ${b.host}, ${sql.json(b.shape as postgres.JSONValue)})
    ON CONFLICT ON CONSTRAINT secret_bindings_name_host_key DO NOTHING
    RETURNING *`;
  return rows[0] ?? 'conflict';
}

/** The account's bindings, oldest first. */
export async function listBindings(sql: Sql, accountId: string): Promise<BindingRow[]> {
  return sql<BindingRow[]>`SELECT * FROM secret_bindings WHERE account_id = ${accountId} ORDER BY id`;
}

export async function getBinding(sql: Sql, accountId: string, id: string): Promise<BindingRow | undefined> {
  const rows = await sql<BindingRow[]>`SELECT * FROM secret_bindings WHERE account_id = ${accountId} AND id = ${id}`;
  return rows[0];
}

/**
 * Writes the fields given; undefined when the account has no such binding, 'conflict' when the
 * new name and host are those of another of its bindings. (Inside a caller's transaction the
 * failed update aborts it: the caller answers the conflict and rolls back.)
 */
export async function updateBinding(
  sql: Sql,
  accountId: string,
  id: string,
  c: { secretName?: string | undefined; host?: string | undefined; shape?: BindingShapeValue | undefined },
): Promise<BindingRow | undefined | 'conflict'> {
  try {
    const rows = await sql<BindingRow[]>`
      UPDATE secret_bindings SET updated_at = now()
        ${c.secretName === undefined ? sql`` : sql`, secret_name = ${c.secretName}`}
        ${c.host === undefined ? sql`` : sql`, host = ${c.host}`}
        ${c.shape === undefined ? sql`` : sql`, shape = ${sql.json(c.shape as postgres.JSONValue)}`}
      WHERE account_id = ${accountId} AND id = ${id}
      RETURNING *`;
    return rows[0];
  } catch (err) {
    if (isNameHostTaken(err)) return 'conflict';
    throw err;
  }
}

/** False when the account has no such binding. Egress rows that named it keep its id. */
export async function deleteBinding(sql: Sql, accountId: string, id: string): Promise<boolean> {
  const rows = await sql`DELETE FROM secret_bindings WHERE account_id = ${accountId} AND id = ${id} RETURNING id`;
  return rows.length === 1;
}

/**
 * The account's bindings whose secret name is among `secretNames` (what a sandbox holding those
 * secrets has bound), ordered by secret name, then host.
 */
export async function bindingsForSecrets(sql: Sql, accountId: string, secretNames: string[]): Promise<BindingRow[]> {
  if (secretNames.length === 0) return [];
  return sql<BindingRow[]>`
    SELECT * FROM secret_bindings WHERE account_id = ${accountId} AND secret_name = ANY(${secretNames})
    ORDER BY secret_name, host`;
}
