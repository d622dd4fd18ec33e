import {
  closeSync,
  fstatSync,
  ftruncateSync,
  openSync,
  readdirSync,
  readSync,
  statSync,
  unlinkSync,
  writevSync,
} from 'node:fs';
import { join } from 'node:path';
import * as zlib from 'node:zlib';

/**
 * The spool: a sandbox incarnation's output on disk (DESIGN.md "The runner fabric"), as
 * segment files under `<root>/spool/`, each a run of framed records
 *
 *   seq (u64 BE) | payload length (u32 BE) | CRC32 of the payload (u32 BE) | payload
 *
 * numbered consecutively from the number in the file's name. A record is written with one
 * `writev`, never rewritten, and read back only whole with a matching CRC: a torn write (the
 * process or the machine stopped mid-record) or a damaged byte is found on restart, and
 * everything from that record on is cut off, so a reader never sees half a record.
 */

/** Bytes before each record's payload. */
export const RECORD_HEADER_BYTES = 16;
/** A longer payload is not one we wrote (a protocol event is at most a few MiB): the length is damaged. */
export const MAX_RECORD_BYTES = 64 * 1024 * 1024;
const READ_CHUNK = 64 * 1024;

// zlib's CRC-32 (IEEE 802.3, the one PNG uses) is built into Node from 20.15 (hence the
// engines field): no table of our own and no native module. An older Node is told so here
// rather than failing on a missing export.
if (typeof zlib.crc32 !== 'function') {
  throw new Error(`the runner needs Node.js 20.15 or newer (for zlib.crc32); this is ${process.version}`);
}
const { crc32 } = zlib;

/** A record's header and payload, to be written together. */
export function frameRecord(seq: number, payload: Uint8Array): [Buffer, Uint8Array] {
  const header = Buffer.allocUnsafe(RECORD_HEADER_BYTES);
  header.writeBigUInt64BE(BigInt(seq), 0);
  header.writeUInt32BE(payload.length, 8);
  header.writeUInt32BE(crc32(payload), 12);
  return [header, payload];
}

/**
 * Appends one record at `size` (the file's length so far) and returns the new length. On a
 * failed write (a full disk) the file is cut back to `size`, so no half record stays behind
 * for the next one to follow, and the error is thrown.
 */
export function appendRecord(fd: number, size: number, seq: number, payload: Uint8Array): number {
  const parts = frameRecord(seq, payload);
  const length = RECORD_HEADER_BYTES + payload.length;
  try {
    let written = writevSync(fd, parts, size);
    // A short write is rare but allowed; finish it from where it stopped.
    while (written < length) {
      const whole = Buffer.concat(parts);
      written += writevSync(fd, [whole.subarray(written)], size + written);
    }
  } catch (err) {
    try {
      ftruncateSync(fd, size);
    } catch {}
    throw err;
  }
  return size + length;
}

export type ReadRecord = { seq: number; payload: Buffer };

/**
 * Reads whole, checked records in order from `offset` up to `limit()` (re-read at each
 * record, so a reader can follow a file that is still being appended to). Reads in chunks,
 * so memory stays at a chunk or one record, whatever the file's size.
 */
export class RecordReader {
  private buf: Buffer = Buffer.alloc(0);
  /** The file offset of `buf[0]`. */
  private bufAt = 0;

  constructor(
    private readonly fd: number,
    /** The offset of the next record. */
    public offset: number,
    private readonly limit: () => number,
  ) {}

  /**
   * The next record; `end` where the readable part ends at a record boundary; `torn` where
   * what follows is not a whole record with a sane length and a matching CRC (the offset
   * stays at that record's start).
   */
  next(): ReadRecord | 'end' | 'torn' {
    if (this.offset >= this.limit()) return 'end';
    if (!this.ensure(RECORD_HEADER_BYTES)) return 'torn';
    let at = this.offset - this.bufAt;
    const seq = Number(this.buf.readBigUInt64BE(at));
    const length = this.buf.readUInt32BE(at + 8);
    const crc = this.buf.readUInt32BE(at + 12);
    if (length > MAX_RECORD_BYTES) return 'torn';
    if (!this.ensure(RECORD_HEADER_BYTES + length)) return 'torn';
    at = this.offset - this.bufAt;
    const payload = this.buf.subarray(at + RECORD_HEADER_BYTES, at + RECORD_HEADER_BYTES + length);
    if (crc32(payload) !== crc) return 'torn';
    this.offset += RECORD_HEADER_BYTES + length;
    return { seq, payload };
  }

  /** Makes `n` bytes from `offset` available in `buf`; false when the file ends before. */
  private ensure(n: number): boolean {
    const limit = this.limit();
    if (this.offset + n > limit) return false;
    if (this.bufAt + this.buf.length >= this.offset + n && this.bufAt <= this.offset) return true;
    const want = Math.min(Math.max(n, READ_CHUNK), limit - this.offset);
    const chunk = Buffer.allocUnsafe(want);
    let got = 0;
    while (got < want) {
      const r = readSync(this.fd, chunk, got, want - got, this.offset + got);
      if (r === 0) break;
      got += r;
    }
    this.buf = chunk.subarray(0, got);
    this.bufAt = this.offset;
    return got >= n;
  }
}

/** One segment file: records `first` to `last` (`last` is `first - 1` while it is empty). */
export interface Segment {
  path: string;
  first: number;
  last: number;
  /** Its length: where the next record goes. */
  bytes: number;
}

// File names must not let a sandbox id reach outside the spool directory or hide a dot.
const encodeId = (id: string) => encodeURIComponent(id).replace(/\./g, '%2E');

/** `<sandbox>.<incarnation>.<first seq>.spool`: the name alone says where numbering continues. */
export function segmentPath(dir: string, sandbox: string, incarnation: number, first: number): string {
  return join(dir, `${encodeId(sandbox)}.${incarnation}.${String(first).padStart(12, '0')}.spool`);
}

/** What the spool held for one sandbox incarnation when the runner started. */
export interface RecoveredSpool {
  sandbox: string;
  incarnation: number;
  /** Whole records, oldest segment first; the last one is where appends continue. */
  segments: Segment[];
  /** Records kept. */
  records: number;
  /** Bytes cut off after a torn or damaged record (0 when every file ended cleanly). */
  cutBytes: number;
}

/**
 * Reads every segment under `dir` and keeps, per sandbox incarnation, the longest run of
 * whole, checked records numbered without holes. At the first record that is torn, damaged
 * or out of sequence the file is truncated there and later segments of that incarnation are
 * deleted: the tail after a tear is never half-read and never resent.
 */
export function recoverSpool(dir: string): RecoveredSpool[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const groups = new Map<string, { sandbox: string; incarnation: number; files: { path: string; first: number }[] }>();
  for (const name of names) {
    const m = /^([^.]+)\.(\d+)\.(\d+)\.spool$/.exec(name);
    if (!m?.[1] || !m[2] || !m[3]) continue;
    let sandbox: string;
    try {
      sandbox = decodeURIComponent(m[1]);
    } catch {
      continue;
    }
    const key = `${m[1]}.${m[2]}`;
    let g = groups.get(key);
    if (!g) {
      g = { sandbox, incarnation: Number(m[2]), files: [] };
      groups.set(key, g);
    }
    g.files.push({ path: join(dir, name), first: Number(m[3]) });
  }
  const recovered: RecoveredSpool[] = [];
  for (const g of groups.values()) {
    g.files.sort((a, b) => a.first - b.first);
    const segments: Segment[] = [];
    let records = 0;
    let cutBytes = 0;
    let expected: number | undefined;
    let broken = false;
    for (const file of g.files) {
      if (broken || (expected !== undefined && file.first !== expected)) {
        // After a tear, or not where the one before ended: not part of the run.
        broken = true;
        cutBytes += sizeOf(file.path);
        unlinkSync(file.path);
        continue;
      }
      const fd = openSync(file.path, 'r+');
      try {
        const size = fstatSync(fd).size;
        const reader = new RecordReader(fd, 0, () => size);
        let next = file.first;
        let good = 0;
        for (;;) {
          const r = reader.next();
          if (r === 'end') break;
          if (r === 'torn' || r.seq !== next) {
            broken = true;
            cutBytes += size - good;
            ftruncateSync(fd, good);
            break;
          }
          good = reader.offset;
          next++;
          records++;
        }
        segments.push({ path: file.path, first: file.first, last: next - 1, bytes: good });
        expected = next;
      } finally {
        closeSync(fd);
      }
    }
    // Only the newest segment may be empty: an older empty one holds nothing to keep.
    const kept = segments.filter((s, i) => s.last >= s.first || i === segments.length - 1);
    for (const s of segments) if (!kept.includes(s)) unlinkSync(s.path);
    if (kept.length)
      recovered.push({ sandbox: g.sandbox, incarnation: g.incarnation, segments: kept, records, cutBytes });
  }
  return recovered;
}

function sizeOf(path: string): number {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
}
