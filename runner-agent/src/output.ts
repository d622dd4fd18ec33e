import { closeSync, mkdirSync, openSync, unlinkSync } from 'node:fs';
import type { RunnerEvent, RunnerOutput } from '@svc/core';
import { Packr } from 'msgpackr';
import { appendRecord, RecordReader, type RecoveredSpool, type Segment, segmentPath } from './spool.ts';

/** Events per output frame (the protocol allows up to 1000). */
const FRAME_EVENTS = 500;
/** Encoded event bytes per output frame (the service takes frames of up to 16 MiB). */
const FRAME_BYTES = 4 * 1024 * 1024;

export const OUTPUT_MEMORY_DEFAULTS = {
  /** Encoded bytes of events held in memory per sandbox incarnation. */
  bytes: 8 * 1024 * 1024,
  /** Events held in memory per sandbox incarnation (many tiny events cost more than their bytes). */
  events: 50_000,
  /** A spool segment is closed and a new one begun past this size, so durable output can be deleted. */
  segmentBytes: 8 * 1024 * 1024,
};

export interface OutputLogOptions {
  /** The spool directory (`<root>/spool`). */
  dir: string;
  memoryBytes?: number;
  memoryEvents?: number;
  segmentBytes?: number;
}

// The same plain-map msgpack as the wire (core's encodeFrame), for one event at a time.
const packr = new Packr({ useRecords: false, moreTypes: false });

/**
 * One sandbox incarnation's output, numbered from 1 without holes, kept until the service
 * says the Postgres copy holds it (`durable`). What was sent but not yet acknowledged as
 * appended is sent again after a reconnect or when the service reports a shorter mark; the
 * log drops what it already has, so nothing is lost or doubled.
 *
 * Every event is written ahead to the spool before it is numbered, so all that is not yet
 * durable survives the runner's process (`OutputLog.recover`). Memory holds only the newest
 * events, up to `memoryBytes` / `memoryEvents`: older ones are read back from the spool as
 * they are (re)sent, with no more than `memoryBytes` of them sent and not yet acknowledged at
 * a time, so memory stays bounded however long the service is away and however much is said
 * meanwhile. Spool segments are deleted once everything in them is durable.
 */
export class OutputLog {
  private next: number;
  /** The oldest number not yet durable. */
  private base: number;
  /** Highest number handed to the connection. */
  private sent: number;
  /** The newest events, numbers `memBase` to `next - 1` (from `memHead` in the arrays). */
  private memEvents: RunnerEvent[] = [];
  private memSizes: number[] = [];
  private memHead = 0;
  private memBase: number;
  private memBytes = 0;
  /** Sent and not yet acknowledged as appended, oldest first. */
  private inflight: { start: number; end: number; bytes: number }[] = [];
  private inflightBytes = 0;
  /** Oldest first; appends go to the last, whose file is open while it holds anything not durable. */
  private readonly segments: Segment[];
  private fd: number | undefined;
  /** Where reading back from the spool left off. */
  private cursor: { segment: Segment; fd: number; reader: RecordReader; seq: number } | undefined;
  private closed = false;
  private readonly memoryBytes: number;
  private readonly memoryEvents: number;
  private readonly segmentBytes: number;
  private readonly dir: string;

  constructor(
    readonly sandbox: string,
    readonly incarnation: number,
    options: OutputLogOptions,
    recovered?: RecoveredSpool,
  ) {
    this.dir = options.dir;
    this.memoryBytes = options.memoryBytes ?? OUTPUT_MEMORY_DEFAULTS.bytes;
    this.memoryEvents = options.memoryEvents ?? OUTPUT_MEMORY_DEFAULTS.events;
    this.segmentBytes = options.segmentBytes ?? OUTPUT_MEMORY_DEFAULTS.segmentBytes;
    if (recovered?.segments.length) {
      this.segments = recovered.segments.map((s) => ({ ...s }));
      const active = this.segments[this.segments.length - 1] as Segment;
      this.base = (this.segments[0] as Segment).first;
      this.next = active.last + 1;
    } else {
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      this.base = 1;
      this.next = 1;
      const segment = this.newSegment(1);
      this.segments = [segment];
      // Claims the name: a file left there is not this log's (recovery would have found it).
      this.fd = openSync(segment.path, 'w', 0o600);
    }
    this.sent = this.base - 1;
    this.memBase = this.next;
  }

  /** The output the spool under `dir` kept from before a restart, one log per sandbox incarnation. */
  static recover(recovered: RecoveredSpool[], options: OutputLogOptions): OutputLog[] {
    return recovered.map((r) => new OutputLog(r.sandbox, r.incarnation, options, r));
  }

  /**
   * Writes the event to the spool, numbers it and keeps it; returns its number. Throws when
   * the spool cannot take it (a full disk): then it is not numbered, and numbering stays
   * without holes.
   */
  push(event: RunnerEvent): number {
    if (this.closed) throw new Error('the output log is closed');
    const payload = packr.pack(event);
    let active = this.segments[this.segments.length - 1] as Segment;
    if (active.bytes >= this.segmentBytes && active.last >= active.first) active = this.roll();
    this.fd ??= openSync(active.path, 'r+');
    active.bytes = appendRecord(this.fd, active.bytes, this.next, payload);
    active.last = this.next;
    this.memEvents.push(event);
    this.memSizes.push(payload.length);
    this.memBytes += payload.length;
    while (this.memCount > 0 && (this.memBytes > this.memoryBytes || this.memCount > this.memoryEvents)) {
      this.dropOldestInMemory();
    }
    return this.next++;
  }

  /**
   * Frames with what is not yet sent, in order. What memory no longer holds is read back from
   * the spool, at most `memoryBytes` of it unacknowledged at a time: the rest follows as
   * `appended` arrives (the caller calls this again then).
   */
  unsent(): RunnerOutput[] {
    const frames: RunnerOutput[] = [];
    let from = Math.max(this.sent + 1, this.base);
    while (from < this.memBase && this.inflightBytes < this.memoryBytes) {
      const { events, bytes } = this.readSpool(from, this.memBase, this.memoryBytes - this.inflightBytes);
      frames.push(this.frame(from, events, bytes));
      from += events.length;
    }
    if (from >= this.memBase) {
      while (from < this.next) {
        const events: RunnerEvent[] = [];
        let bytes = 0;
        for (let i = this.memHead + (from - this.memBase); i < this.memEvents.length; i++) {
          const size = this.memSizes[i] as number;
          if (events.length === FRAME_EVENTS || (events.length > 0 && bytes + size > FRAME_BYTES)) break;
          events.push(this.memEvents[i] as RunnerEvent);
          bytes += size;
        }
        frames.push(this.frame(from, events, bytes));
        from += events.length;
      }
    }
    this.sent = from - 1;
    return frames;
  }

  private frame(seq: number, events: RunnerEvent[], bytes: number): RunnerOutput {
    this.inflight.push({ start: seq, end: seq + events.length - 1, bytes });
    this.inflightBytes += bytes;
    return { t: 'output', sandbox: this.sandbox, incarnation: this.incarnation, seq, events };
  }

  /**
   * The log holds everything up to `hwm`. An answer to a frame that is followed by frames
   * still on their way is just that; a mark short of what was sent before the frames in
   * flight (the log lost some, or refused a gap) sends everything beyond it again.
   */
  appended(hwm: number): void {
    while (this.inflight.length && (this.inflight[0] as { end: number }).end <= hwm) {
      this.inflightBytes -= (this.inflight.shift() as { bytes: number }).bytes;
    }
    const oldest = this.inflight[0];
    const expected = oldest ? oldest.start - 1 : this.sent;
    if (hwm < expected) {
      this.sent = Math.max(hwm, this.base - 1);
      this.inflight = [];
      this.inflightBytes = 0;
    }
  }

  /** The copy holds everything up to `seq`: forget it, in memory and on disk. */
  durable(seq: number): void {
    const upto = Math.min(seq, this.next - 1);
    if (upto < this.base || this.closed) return;
    this.base = upto + 1;
    this.sent = Math.max(this.sent, upto);
    while (this.memCount > 0 && this.memBase < this.base) this.dropOldestInMemory();
    while (this.segments.length > 1 && (this.segments[0] as Segment).last < this.base) {
      this.forgetSegment(this.segments.shift() as Segment);
    }
    const active = this.segments[0] as Segment;
    if (this.base === this.next && active.bytes > 0) {
      // All durable: a fresh empty segment named after the next number carries the
      // numbering across a restart; it exists before the old one goes, so a crash between
      // the two leaves the numbering intact.
      this.roll();
      this.forgetSegment(this.segments.shift() as Segment);
    }
    if (this.base === this.next) {
      this.closeFile();
      this.closeCursor();
    }
  }

  /**
   * The service will never take this output: forget all of it, in memory and on disk. The log
   * is closed; nothing more may be pushed.
   */
  discard(): number {
    const dropped = this.next - this.base;
    this.closeCursor();
    this.closeFile();
    for (const segment of this.segments.splice(0)) this.forgetSegment(segment);
    this.memEvents = [];
    this.memSizes = [];
    this.memHead = 0;
    this.memBytes = 0;
    this.inflight = [];
    this.inflightBytes = 0;
    this.base = this.next;
    this.closed = true;
    return dropped;
  }

  /** After a reconnect everything still kept is sent again (the service drops what it has). */
  rewind(): void {
    this.sent = this.base - 1;
    this.inflight = [];
    this.inflightBytes = 0;
  }

  /** Closes the spool's files; what they hold stays for the next start. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.closeCursor();
    this.closeFile();
  }

  /** Events kept, not yet durable (in memory or only on disk). */
  get kept(): number {
    return this.next - this.base;
  }

  /** Events held in memory, and their encoded bytes (bounded by the options). */
  get inMemory(): { events: number; bytes: number } {
    return { events: this.memCount, bytes: this.memBytes };
  }

  /** Spool files of this incarnation, oldest first, and their sizes. */
  get spool(): { path: string; bytes: number }[] {
    return this.segments.map((s) => ({ path: s.path, bytes: s.bytes }));
  }

  private get memCount(): number {
    return this.memEvents.length - this.memHead;
  }

  private dropOldestInMemory(): void {
    this.memBytes -= this.memSizes[this.memHead] as number;
    this.memHead++;
    this.memBase++;
    // Compact now and then rather than shift on every drop (O(1) amortized).
    if (this.memHead > 1024 && this.memHead * 2 > this.memEvents.length) {
      this.memEvents = this.memEvents.slice(this.memHead);
      this.memSizes = this.memSizes.slice(this.memHead);
      this.memHead = 0;
    }
  }

  private newSegment(first: number): Segment {
    return { path: segmentPath(this.dir, this.sandbox, this.incarnation, first), first, last: first - 1, bytes: 0 };
  }

  /** Starts a new segment at the next number; the current one is complete. */
  private roll(): Segment {
    const segment = this.newSegment(this.next);
    const fd = openSync(segment.path, 'w', 0o600);
    this.closeFile();
    this.fd = fd;
    this.segments.push(segment);
    return segment;
  }

  /** An incarnation with nothing left to keep holds no file open (a runner sees many). */
  private closeFile(): void {
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
  }

  private forgetSegment(segment: Segment): void {
    if (this.cursor?.segment === segment) this.closeCursor();
    try {
      unlinkSync(segment.path);
    } catch (err) {
      // Already gone is what was wanted.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }

  private closeCursor(): void {
    if (this.cursor) closeSync(this.cursor.fd);
    this.cursor = undefined;
  }

  /**
   * Reads a frame's worth of events from the spool, from number `from`, below `until`, about
   * `budget` bytes of them (at least one event).
   */
  private readSpool(from: number, until: number, budget: number): { events: RunnerEvent[]; bytes: number } {
    if (this.cursor?.seq !== from) this.seek(from);
    const events: RunnerEvent[] = [];
    let bytes = 0;
    const most = Math.min(FRAME_BYTES, budget);
    while (from + events.length < until && events.length < FRAME_EVENTS && (events.length === 0 || bytes < most)) {
      const cursor = this.cursor as NonNullable<OutputLog['cursor']>;
      const r = cursor.reader.next();
      if (r === 'end') {
        const after = this.segments[this.segments.indexOf(cursor.segment) + 1];
        if (!after) throw new Error(`spool of ${this.sandbox}:${this.incarnation} ends before ${cursor.seq}`);
        this.openCursor(after);
        continue;
      }
      if (r === 'torn' || r.seq !== cursor.seq) {
        // Written whole and checked at start: only damage after the fact gets here.
        throw new Error(`spool of ${this.sandbox}:${this.incarnation} is damaged at ${cursor.seq}`);
      }
      events.push(packr.unpack(r.payload) as RunnerEvent);
      bytes += r.payload.length;
      cursor.seq++;
    }
    return { events, bytes };
  }

  /** Places the cursor before record `seq`, skipping the records before it in its segment. */
  private seek(seq: number): void {
    const segment = this.segments.find((s) => s.first <= seq && seq <= s.last);
    if (!segment) throw new Error(`spool of ${this.sandbox}:${this.incarnation} does not hold ${seq}`);
    this.openCursor(segment);
    const cursor = this.cursor as NonNullable<OutputLog['cursor']>;
    while (cursor.seq < seq) {
      const r = cursor.reader.next();
      if (typeof r === 'string') throw new Error(`spool of ${this.sandbox}:${this.incarnation} is damaged`);
      cursor.seq++;
    }
  }

  private openCursor(segment: Segment): void {
    this.closeCursor();
    const fd = openSync(segment.path, 'r');
    this.cursor = { segment, fd, reader: new RecordReader(fd, 0, () => segment.bytes), seq: segment.first };
  }
}
