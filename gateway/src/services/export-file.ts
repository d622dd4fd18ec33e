import { createWriteStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { createGzip } from 'node:zlib';
import { exports as exportRows, type Sql } from '@svc/db';
import type { EventLog } from '../log/log.ts';
import { readLog } from '../log/read.ts';
import { shapeEvent } from './conversations.ts';

/**
 * The lists of an export file, in the order it holds them: a section per resource table
 * (`exports.EXPORT_SECTIONS`), then `events`, the whole log. Route descriptions are made from
 * it, so they name every list the file has.
 */
export const EXPORT_FILE_LISTS = [...(Object.keys(exportRows.EXPORT_SECTIONS) as exportRows.ExportSection[]), 'events'];

/** Rows of a table, and log events, read per round trip. */
const PAGE = 1000;

export interface ExportFileDeps {
  sql: Sql;
  log: EventLog;
}

/** What the build reports as it goes; resolving false stops the build (the claim was lost). */
export type ExportProgress = (eventsWritten: number) => Promise<boolean>;

/** Thrown when the progress callback says the build no longer owns its export. */
export class ExportClaimLost extends Error {
  constructor() {
    super('the export was taken over or removed');
    this.name = 'ExportClaimLost';
  }
}

/**
 * Writes the account's export to `path`: one JSON object
 * `{format, version, account_id, exported_at, agents: [...], ..., audit: [...], events: [...]}`
 * through gzip. The JSON is produced page by page and pulled by the file stream, so memory
 * holds one page at a time whatever the account's size (the gzip and file streams' buffers
 * apply backpressure to the reads). Resolves to the number of events written. Secret values
 * are never read: each section's query leaves out its ciphertext columns.
 */
export async function writeExportFile(
  deps: ExportFileDeps,
  accountId: string,
  path: string,
  progress: ExportProgress,
  now: Date,
): Promise<number> {
  let events = 0;
  async function* json(): AsyncGenerator<string> {
    yield `{"format":"svc-export","version":1,"account_id":${JSON.stringify(accountId)},"exported_at":${JSON.stringify(now.toISOString())}`;
    for (const section of Object.keys(exportRows.EXPORT_SECTIONS) as exportRows.ExportSection[]) {
      yield `,${JSON.stringify(section)}:[`;
      let after: string | null = null;
      let first = true;
      for (;;) {
        const page = await exportRows.pageOfSection(deps.sql, section, accountId, after, PAGE);
        if (page.length === 0) break;
        yield (first ? '' : ',') + page.map((r) => JSON.stringify(r.row)).join(',');
        first = false;
        after = (page.at(-1) as { key: string }).key;
        if (page.length < PAGE) break;
      }
      yield ']';
    }
    yield ',"events":[';
    let after = 0;
    for (;;) {
      const page = await readLog(deps, accountId, { after, limit: PAGE }, { durableFirst: true });
      if (page.length === 0) break;
      yield (events === 0 ? '' : ',') +
        page.map((e) => JSON.stringify({ ...shapeEvent(e), conversation_id: e.conversationId })).join(',');
      events += page.length;
      after = (page.at(-1) as { id: number }).id;
      if (!(await progress(events))) throw new ExportClaimLost();
      if (page.length < PAGE) break;
    }
    yield ']}';
  }
  await pipeline(json, createGzip(), createWriteStream(path, { flags: 'w' }));
  return events;
}

/** Size of the file at `path`, in bytes. */
export async function fileSize(path: string): Promise<number> {
  return (await stat(path)).size;
}
