import { mkdir, readdir, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ApiError, newId } from '@svc/core';
import { exports as exportRows, type Sql } from '@svc/db';
import type { Logger } from 'pino';
import type { EventLog } from '../log/log.ts';
import { recordAudit } from './audit.ts';
import { ExportClaimLost, fileSize, writeExportFile } from './export-file.ts';
import { actorOf, type Principal } from './principal.ts';

/** One export request per account per hour (SPEC Limits). */
export const EXPORT_INTERVAL_MS = 60 * 60_000;
/** After this many claims that did not finish, an export ends `failed`. */
export const EXPORT_MAX_ATTEMPTS = 5;

/**
 * Where export files live: `<DATA_DIR>/exports/<account>/<export>.json.gz`, one folder per
 * account so erasing an account removes its files in one go. A file under construction is
 * `<export>.<claim>.part` and is renamed into place only when complete, so the final name
 * always holds a whole file.
 */
export class ExportFiles {
  constructor(private readonly root: string) {}

  dirOf(accountId: string): string {
    return join(this.root, 'exports', accountId);
  }

  fileOf(accountId: string, id: string): string {
    return join(this.dirOf(accountId), `${id}.json.gz`);
  }

  partOf(accountId: string, id: string, attempt: number): string {
    return join(this.dirOf(accountId), `${id}.${attempt}.part`);
  }

  /** Removes export `id`'s file and any partial builds of it; missing files are fine. */
  async remove(accountId: string, id: string): Promise<void> {
    await this.removeMatching(accountId, (n) => n.startsWith(`${id}.`));
  }

  /** Removes the partial builds of export `id` that workers which died left behind. */
  async removeParts(accountId: string, id: string): Promise<void> {
    await this.removeMatching(accountId, (n) => n.startsWith(`${id}.`) && n.endsWith('.part'));
  }

  private async removeMatching(accountId: string, match: (name: string) => boolean): Promise<void> {
    const names = await readdir(this.dirOf(accountId)).catch(() => [] as string[]);
    await Promise.all(names.filter(match).map((n) => rm(join(this.dirOf(accountId), n), { force: true })));
  }

  /** Removes every export file of the account (its erasure). */
  async removeAccount(accountId: string): Promise<void> {
    await rm(this.dirOf(accountId), { recursive: true, force: true });
  }
}

function shape(row: exportRows.ExportRow) {
  const ready = row.status === 'ready';
  return {
    id: row.id,
    status: row.status,
    downloadable: ready,
    progress: { events_written: row.events_written },
    bytes: row.bytes,
    download_url: ready ? `/api/account/exports/${row.id}/download` : null,
    created_at: row.created_at.toISOString(),
    completed_at: row.completed_at?.toISOString() ?? null,
  };
}

/**
 * Starts an export of the caller's account: a pending export the worker builds. Refused with
 * 429 `rate_limited` (and `Retry-After` in seconds) inside the hour after the last request, and
 * while an older one is still being built (one at a time).
 */
export async function requestExport(sql: Sql, p: Principal, now: Date) {
  const last = await exportRows.latest(sql, p.accountId);
  if (last) {
    const wait = last.created_at.getTime() + EXPORT_INTERVAL_MS - now.getTime();
    if (wait > 0) {
      throw new ApiError('rate_limited', 'An export can be requested once an hour.', {
        retryAfter: Math.ceil(wait / 1000),
      });
    }
  }
  const row = await exportRows.insertPending(sql, newId('exp'), p.accountId);
  if (!row) {
    throw new ApiError('rate_limited', 'An export is already being built; one at a time.', { retryAfter: 60 });
  }
  await recordAudit(sql, actorOf(p), 'account.export_requested', { type: 'export', id: row.id });
  return shape(row);
}

/** The account's latest export as a zero- or one-element list. */
export async function listExports(sql: Sql, accountId: string) {
  const row = await exportRows.latest(sql, accountId);
  return row ? [shape(row)] : [];
}

export async function getExport(sql: Sql, accountId: string, id: string) {
  const row = await exportRows.getExport(sql, accountId, id);
  if (!row) throw new ApiError('not_found', 'No such export.');
  return shape(row);
}

/** The path of export `id`'s complete file; 404 until it is downloadable, and for another tenant's id. */
export async function downloadPath(sql: Sql, files: ExportFiles, accountId: string, id: string) {
  const row = await exportRows.getExport(sql, accountId, id);
  if (!row) throw new ApiError('not_found', 'No such export.');
  if (row.status !== 'ready') throw new ApiError('not_found', 'The export is not downloadable yet.');
  return { path: files.fileOf(accountId, id), bytes: row.bytes };
}

export interface ExportBuildDeps {
  sql: Sql;
  log: EventLog;
  files: ExportFiles;
  logger: Logger;
  now: () => Date;
}

/**
 * Builds one claimed export (claim number `attempt`): writes the file under a claim-specific
 * part name, extending the lease at each page of events, renames it into place, then marks the
 * export ready and removes the files of the older exports it replaces (and parts that dead
 * workers left). A build whose claim
 * passed to another worker stops and leaves no file of its own; one that fails is released for
 * the next pass, or ends `failed` after EXPORT_MAX_ATTEMPTS. A file whose export vanished
 * meanwhile (the account was erased) is removed.
 */
export async function buildExport(
  deps: ExportBuildDeps,
  row: exportRows.ExportRow,
  leaseMs: number,
): Promise<'ready' | 'lost' | 'failed' | 'retry'> {
  const { files } = deps;
  const attempt = row.attempts;
  const part = files.partOf(row.account_id, row.id, attempt);
  try {
    await mkdir(files.dirOf(row.account_id), { recursive: true });
    const progress = (n: number) =>
      exportRows.recordProgress(deps.sql, row.id, attempt, n, new Date(deps.now().getTime() + leaseMs));
    const events = await writeExportFile(deps, row.account_id, part, progress, deps.now());
    const bytes = await fileSize(part);
    const final = files.fileOf(row.account_id, row.id);
    await rename(part, final);
    const older = await exportRows.markReady(deps.sql, row.id, attempt, {
      eventsWritten: events,
      bytes,
      at: deps.now(),
    });
    if (older === undefined) {
      if (!(await exportRows.exists(deps.sql, row.id))) await files.remove(row.account_id, row.id);
      return 'lost';
    }
    await Promise.all([
      files.removeParts(row.account_id, row.id),
      ...older.map((id) => files.remove(row.account_id, id)),
    ]);
    return 'ready';
  } catch (err) {
    // Removing the part may fail for the same reason the build did; the failure is recorded anyway.
    await rm(part, { force: true }).catch(() => undefined);
    if (err instanceof ExportClaimLost) {
      if (!(await exportRows.exists(deps.sql, row.id))) await files.remove(row.account_id, row.id);
      return 'lost';
    }
    const final = attempt >= EXPORT_MAX_ATTEMPTS;
    deps.logger.warn({ exportId: row.id, attempt, err: { message: (err as Error).message } }, 'export build failed');
    await exportRows.recordFailure(deps.sql, row.id, attempt, (err as Error).message, final);
    return final ? 'failed' : 'retry';
  }
}
