/**
 * A reader of one replay, in a process of its own (forked by scenarios/replay.ts, so it never
 * shares an event loop with what it measures). Sent one job over IPC, it reads the range,
 * answers `{type: 'result', ...}` and exits when told `bye` (the parent reads its CPU first).
 *
 * - `sse`: a raw socket to the edge, `GET <path>` with `Last-Event-ID: after`, read until the
 *   frame with `id: last` has arrived. Time to first byte (the head), to the first event, and
 *   to the last event, all from the moment the request is written.
 * - `xrange`: XRANGE over a Redis stream in pages (ioredis), from `after` exclusive to `last`.
 * - `select`: SELECT over log_events in pages (postgres), `after` exclusive to `last` inclusive,
 *   the columns and order readStored uses.
 */
import { connect } from 'node:net';
import { Redis } from 'ioredis';
import postgres from 'postgres';

export type ReaderJob =
  | { mode: 'sse'; port: number; path: string; key: string; after: number; last: number; timeoutMs: number }
  | { mode: 'xrange'; redisUrl: string; key: string; after: number; last: number; page: number }
  | { mode: 'select'; pgUrl: string; accountId: string; after: number; last: number; page: number };

export interface ReaderResult {
  type: 'result';
  events: number;
  bytes: number;
  /** From the request (or first page asked) to the last event, ms. */
  totalMs: number;
  /** SSE: the first byte of the response; raw: the first page back. */
  firstByteMs: number;
  /** SSE: the first event frame; raw: the first page back. */
  firstEventMs: number;
  /** [ms since start, events so far], at most one point per 5 ms. */
  timeline: [number, number][];
  error?: string;
}

function recorder() {
  const start = performance.now();
  const timeline: [number, number][] = [[0, 0]];
  let lastAt = -Infinity;
  return {
    start,
    at: () => performance.now() - start,
    mark(events: number, force = false) {
      const t = performance.now() - start;
      if (force || t - lastAt >= 5) {
        timeline.push([Number(t.toFixed(2)), events]);
        lastAt = t;
      }
    },
    timeline,
  };
}

async function readSse(job: Extract<ReaderJob, { mode: 'sse' }>): Promise<ReaderResult> {
  return await new Promise<ReaderResult>((resolve) => {
    const sock = connect({ port: job.port, host: '127.0.0.1', noDelay: true });
    const rec = recorder();
    let events = 0;
    let bytes = 0;
    let firstByteMs = Number.NaN;
    let firstEventMs = Number.NaN;
    let carry = '';
    const lastLine = `\nid: ${job.last}\n`;
    let settled = false;
    const finish = (error?: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      rec.mark(events, true);
      sock.destroy();
      resolve({
        type: 'result',
        events,
        bytes,
        totalMs: rec.at(),
        firstByteMs,
        firstEventMs,
        timeline: rec.timeline,
        error,
      });
    };
    const timer = setTimeout(() => finish(`timed out after ${job.timeoutMs} ms with ${events} events`), job.timeoutMs);
    sock.on('error', (err) => finish(err.message));
    sock.on('close', () => finish(`connection closed after ${events} events`));
    sock.on('data', (d: Buffer) => {
      if (Number.isNaN(firstByteMs)) firstByteMs = rec.at();
      bytes += d.length;
      // Frames start with an `id:` line (ids and chunk boundaries never fall inside JSON data,
      // which has no raw newline); keep a short carry so a line split across reads counts once.
      const text = carry + d.toString('latin1');
      let i = text.indexOf('\nid: ');
      let found = 0;
      while (i >= 0) {
        if (i + 5 > carry.length) found++;
        i = text.indexOf('\nid: ', i + 1);
      }
      if (bytes === d.length && text.startsWith('HTTP/1.1 ') && !text.startsWith('HTTP/1.1 200')) {
        return finish(`refused: ${text.split('\r\n')[0]}`);
      }
      if (found > 0 && events === 0) firstEventMs = rec.at();
      events += found;
      rec.mark(events);
      if (text.includes(lastLine)) return finish();
      carry = text.slice(-Math.max(lastLine.length, 8));
    });
    sock.write(
      `GET ${job.path} HTTP/1.1\r\nhost: 127.0.0.1:${job.port}\r\nauthorization: Bearer ${job.key}\r\nlast-event-id: ${job.after}\r\naccept: text/event-stream\r\n\r\n`,
    );
  });
}

async function readXrange(job: Extract<ReaderJob, { mode: 'xrange' }>): Promise<ReaderResult> {
  const redis = new Redis(job.redisUrl, { lazyConnect: true });
  await redis.connect();
  await redis.ping();
  const rec = recorder();
  let events = 0;
  let bytes = 0;
  let first = Number.NaN;
  let after = job.after;
  try {
    for (;;) {
      const rows = (await redis.xrange(job.key, `(${after}-0`, `${job.last}-0`, 'COUNT', job.page)) as [
        string,
        string[],
      ][];
      if (Number.isNaN(first)) first = rec.at();
      for (const [, fields] of rows) bytes += (fields[1] as string).length;
      events += rows.length;
      rec.mark(events);
      if (rows.length < job.page) break;
      after = Number((rows.at(-1) as [string, string[]])[0].slice(0, -2));
    }
    rec.mark(events, true);
    return {
      type: 'result',
      events,
      bytes,
      totalMs: rec.at(),
      firstByteMs: first,
      firstEventMs: first,
      timeline: rec.timeline,
    };
  } finally {
    redis.disconnect();
  }
}

async function readSelect(job: Extract<ReaderJob, { mode: 'select' }>): Promise<ReaderResult> {
  const sql = postgres(job.pgUrl, { max: 1, onnotice: () => {} });
  await sql`SELECT 1`;
  const rec = recorder();
  let events = 0;
  let bytes = 0;
  let first = Number.NaN;
  let after = job.after;
  try {
    for (;;) {
      const rows = await sql<{ id: string; data: string | null }[]>`
        SELECT id, conversation_id, turn_id, kind, stream, data, stage, state, duration_ms,
          to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS ts, producer, seq
        FROM log_events WHERE account_id = ${job.accountId} AND id > ${after} AND id <= ${job.last}
        ORDER BY id LIMIT ${job.page}`;
      if (Number.isNaN(first)) first = rec.at();
      for (const r of rows) bytes += r.data?.length ?? 0;
      events += rows.length;
      rec.mark(events);
      if (rows.length < job.page) break;
      after = Number((rows.at(-1) as { id: string }).id);
    }
    rec.mark(events, true);
    return {
      type: 'result',
      events,
      bytes,
      totalMs: rec.at(),
      firstByteMs: first,
      firstEventMs: first,
      timeline: rec.timeline,
    };
  } finally {
    await sql.end({ timeout: 1 });
  }
}

process.once('message', (job: ReaderJob) => {
  const run = job.mode === 'sse' ? readSse(job) : job.mode === 'xrange' ? readXrange(job) : readSelect(job);
  run
    .then((r) => process.send?.(r))
    .catch((err: Error) =>
      process.send?.({
        type: 'result',
        events: 0,
        bytes: 0,
        totalMs: Number.NaN,
        firstByteMs: Number.NaN,
        firstEventMs: Number.NaN,
        timeline: [],
        error: err.stack ?? String(err),
      } satisfies ReaderResult),
    );
  process.on('message', (m: { type?: string }) => {
    if (m.type === 'bye') process.exit(0);
  });
});
process.on('disconnect', () => process.exit(0));
process.send?.({ type: 'ready' });
