import { connect } from 'node:net';
import { createParser } from 'eventsource-parser';
import type { TestService } from './harness.ts';

/** A raw HTTP client: sends the request, collects every byte until the server closes. */
export function rawGet(
  svc: Pick<TestService, 'url'>,
  path: string,
  headers: Record<string, string>,
  opts: { paused?: boolean } = {},
) {
  const url = new URL(svc.url);
  const sock = connect(Number(url.port), url.hostname);
  let received = '';
  const closed = new Promise<void>((resolve) => sock.on('close', () => resolve()));
  sock.on('error', () => {});
  // Kept one character per byte (latin1), so chunk sizes, which count bytes, line up with
  // string offsets; frames() decodes the body as UTF-8.
  sock.on('data', (d: Buffer) => {
    received += d.toString('latin1');
  });
  if (opts.paused) sock.pause();
  // Connection: close, so the socket closes when the response ends rather than idling.
  const head = Object.entries({ host: url.host, connection: 'close', ...headers })
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('');
  sock.write(`GET ${path} HTTP/1.1\r\n${head}\r\n`);
  return { sock, closed, text: () => received };
}

/**
 * The complete SSE frames of a chunked response body (`raw` as rawGet keeps it: a char per
 * byte), as text without the blank line that ends each. A chunk or a frame still arriving is
 * left out, so a test polling a live stream never reads half an event.
 */
export function frames(raw: string): string[] {
  const text = dechunked(raw.slice(raw.indexOf('\r\n\r\n') + 4));
  // What follows the last blank line is a frame not yet ended.
  return Buffer.from(text, 'latin1').toString('utf8').split('\n\n').slice(0, -1).filter(Boolean);
}

/**
 * The data of a chunked body (a char per byte, as rawGet keeps it): the complete chunks, in
 * order, without their sizes; a chunk still arriving is left out.
 */
export function dechunked(body: string): string {
  let text = '';
  let i = 0;
  while (i < body.length) {
    const eol = body.indexOf('\r\n', i);
    if (eol < 0) break;
    const size = Number.parseInt(body.slice(i, eol), 16);
    if (!size || body.length < eol + 2 + size) break;
    text += body.slice(eol + 2, eol + 2 + size);
    i = eol + 2 + size + 2;
  }
  return text;
}

/** An SSE event parsed from a frame: its fields as the WHATWG parser reads them. */
export interface SseEvent {
  id?: string;
  event?: string;
  data?: string;
  comment?: string;
}

/**
 * One frame's fields, read by eventsource-parser (the parser the `eventsource` client uses):
 * `data` only when the frame carries data (lines joined with a newline, as a browser joins
 * them), `id` also for a frame that carries nothing else, `comment` trimmed.
 */
export function parseFrame(frame: string): SseEvent {
  const out: SseEvent = {};
  const parser = createParser({
    onEvent: (e) => {
      out.data = e.data;
      if (e.event !== undefined) out.event = e.event;
    },
    onId: (id) => {
      out.id = id;
    },
    onComment: (comment) => {
      out.comment = comment.trim();
    },
  });
  parser.feed(`${frame}\n\n`);
  return out;
}

/**
 * The bodies of the events' blocks of one kind, joined (`text`: what the agent said, as a
 * client shows it), of one turn when `turnId` is given. Events read with `blocks=true`.
 */
export function blockText(events: WireEvent[], kind = 'text', turnId?: string): string {
  return events
    .filter((e) => turnId === undefined || e.turn_id === turnId)
    .flatMap((e) => e.blocks ?? [])
    .filter((b) => b.kind === kind)
    .map((b) => b.body)
    .join('');
}

/** An event of a conversation's stream as the API sends it (SPEC: the event object), as tests read it. */
export interface WireEvent {
  id: number;
  kind: string;
  stream: string;
  data: string | null;
  stage: string | null;
  state: string | null;
  duration_ms: number | null;
  turn_id: string | null;
  /** When it happened (ISO 8601). */
  ts: string;
  blocks?: {
    kind: string;
    body?: string;
    name?: string;
    request_id?: string;
    summary?: string;
    options?: { optionId: string; name: string; kind: string }[];
  }[];
}
