import {
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  statSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { RunnerEvent, RunnerOutput } from '@svc/core';
import fc from 'fast-check';
import t from 'tap';
import { OutputLog, type OutputLogOptions } from '../../runner-agent/src/output.ts';
import {
  frameRecord,
  RECORD_HEADER_BYTES,
  RecordReader,
  recoverSpool,
  segmentPath,
} from '../../runner-agent/src/spool.ts';

const spoolDir = () => join(mkdtempSync(join(tmpdir(), 'svc-spool-')), 'spool');
const line = (i: number, pad = 60): RunnerEvent => ({
  conversation_id: 'cnv_1',
  turn_id: 'trn_1',
  kind: 'output',
  stream: 'stdout',
  data: `line ${i} ${'.'.repeat(pad)}\n`,
});
const numbersOf = (frames: RunnerOutput[]) => frames.flatMap((f) => f.events.map((_, i) => f.seq + i));
const dataOf = (frames: RunnerOutput[]) => frames.flatMap((f) => f.events.map((e) => e.data));
const files = (dir: string) => readdirSync(dir).sort();
/** Files under `dir` this process holds open (Linux). */
const openUnder = (dir: string) =>
  readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`).startsWith(dir);
    } catch {
      return false;
    }
  }).length;

/** Sends everything the log holds, acknowledging each frame as the service would; returns the frames. */
function drain(log: OutputLog): RunnerOutput[] {
  const all: RunnerOutput[] = [];
  for (let round = 0; round < 10_000; round++) {
    const frames = log.unsent();
    if (frames.length === 0) return all;
    for (const f of frames) {
      all.push(f);
      log.appended(f.seq + f.events.length - 1);
    }
  }
  throw new Error('the log never ran out of frames');
}

/** Writes `n` events to a fresh log under `dir` and closes it, as a process that stops would. */
function spoolOf(dir: string, n: number, options: Partial<OutputLogOptions> = {}): void {
  const log = new OutputLog('sbx_a', 2, { dir, ...options });
  for (let i = 1; i <= n; i++) log.push(line(i));
  log.close();
}

/** Offsets where each record of a segment file starts, and where the file ends. */
function recordStarts(path: string): number[] {
  const bytes = readFileSync(path);
  const starts: number[] = [];
  for (let at = 0; at < bytes.length; at += RECORD_HEADER_BYTES + bytes.readUInt32BE(at + 8)) starts.push(at);
  return [...starts, bytes.length];
}

t.test('the on-disk format does not change: records written by an earlier release read back whole', async (t) => {
  // Two records (seq 7 and 8) exactly as the runner wrote them before it used zlib's CRC-32.
  const earlier = Buffer.from(
    '000000000000000700000035262fb46c7b226b696e64223a226f7574707574222c2273747265616d223a22' +
      '7374646f7574222c2264617461223a2268c3a96c6c6f5c6e227d0000000000000008000000057e62d4c800ff01fe80',
    'hex',
  );
  const payloads = [
    Buffer.from('{"kind":"output","stream":"stdout","data":"héllo\\n"}'),
    Buffer.from([0, 255, 1, 254, 0x80]),
  ];
  t.same(
    Buffer.concat([...frameRecord(7, payloads[0] as Buffer), ...frameRecord(8, payloads[1] as Buffer)]),
    earlier,
    'written alike',
  );

  const dir = spoolDir();
  mkdirSync(dir, { recursive: true });
  const path = segmentPath(dir, 'sbx_a', 2, 7);
  writeFileSync(path, earlier);
  const [spool] = recoverSpool(dir);
  t.same(spool && { records: spool.records, cutBytes: spool.cutBytes }, { records: 2, cutBytes: 0 }, 'nothing cut');
  const fd = openSync(path, 'r');
  t.teardown(() => closeSync(fd));
  const reader = new RecordReader(fd, 0, () => earlier.length);
  t.same(
    [reader.next(), reader.next(), reader.next()],
    [{ seq: 7, payload: payloads[0] }, { seq: 8, payload: payloads[1] }, 'end'],
  );
});

t.test(
  'past its memory bound the log keeps only the newest events in memory and sends the rest from disk',
  async (t) => {
    const dir = spoolDir();
    const log = new OutputLog('sbx_a', 0, { dir, memoryBytes: 4096, memoryEvents: 1000 });
    let peak = 0;
    for (let i = 1; i <= 2000; i++) {
      t.equal(log.push(line(i)), i);
      peak = Math.max(peak, log.inMemory.bytes);
    }
    t.ok(peak <= 4096, `memory never held more than the bound (peak ${peak} bytes)`);
    t.ok(log.inMemory.events < 100, `a few dozen events in memory (${log.inMemory.events}), not 2000`);
    t.equal(log.kept, 2000, 'all of them kept');

    const first = log.unsent();
    const firstBytes = first.reduce((n, f) => n + f.events.reduce((m, e) => m + (e.data?.length ?? 0), 0), 0);
    t.ok(numbersOf(first).length < 2000, 'what is read back from disk goes out a window at a time');
    t.ok(firstBytes < 4096 * 3, `the first window is about the memory bound (${firstBytes} bytes of data)`);
    t.same(log.unsent(), [], 'nothing more before the service answers');
    for (const f of first) log.appended(f.seq + f.events.length - 1);
    const frames = [...first, ...drain(log)];
    t.same(
      numbersOf(frames),
      Array.from({ length: 2000 }, (_, i) => i + 1),
      'every number once, in order',
    );
    t.same(
      dataOf(frames),
      Array.from({ length: 2000 }, (_, i) => line(i + 1).data),
      'with the events as pushed',
    );
    t.ok(
      frames.every((f) => f.events.length <= 500),
      'frames within the protocol limit',
    );
  },
);

t.test('the count bound holds for many tiny events', async (t) => {
  const log = new OutputLog('sbx_a', 0, { dir: spoolDir(), memoryEvents: 10 });
  for (let i = 1; i <= 100; i++) log.push(line(i, 0));
  t.equal(log.inMemory.events, 10);
  t.same(
    numbersOf(drain(log)),
    Array.from({ length: 100 }, (_, i) => i + 1),
  );
});

t.test('a reconnect sends again from the oldest event not durable, through the spool', async (t) => {
  const log = new OutputLog('sbx_a', 0, { dir: spoolDir(), memoryBytes: 2048 });
  for (let i = 1; i <= 300; i++) log.push(line(i));
  drain(log);
  log.durable(120);
  t.equal(log.kept, 180);
  log.rewind();
  const again = drain(log);
  t.same(
    numbersOf(again),
    Array.from({ length: 180 }, (_, i) => i + 121),
  );
  t.same(
    dataOf(again),
    Array.from({ length: 180 }, (_, i) => line(i + 121).data),
  );
});

t.test('an answer to one frame while others are in flight sends nothing again; a shorter mark does', async (t) => {
  const log = new OutputLog('sbx_a', 0, { dir: spoolDir() });
  for (let i = 1; i <= 1200; i++) log.push(line(i, 0));
  const frames = log.unsent();
  t.same(
    frames.map((f) => f.seq),
    [1, 501, 1001],
  );
  log.appended(500);
  t.same(log.unsent(), [], 'the frames after it are on their way');
  log.appended(1000);
  log.appended(300);
  t.same(
    log.unsent().map((f) => f.seq),
    [301, 801],
    'the log holds less than was sent: the rest goes again',
  );
});

t.test('durable output is deleted from disk; the numbering survives in the name of an empty file', async (t) => {
  const dir = spoolDir();
  const log = new OutputLog('sbx_a', 0, { dir, memoryBytes: 1024, segmentBytes: 2000 });
  for (let i = 1; i <= 200; i++) log.push(line(i));
  const segments = files(dir);
  t.ok(segments.length > 5, `several segments (${segments.length})`);
  drain(log);
  log.durable(100);
  const left = files(dir);
  t.ok(left.length < segments.length, 'segments wholly durable are gone');
  t.ok(
    log.spool.every((s, i) => i === 0 || s.bytes > 0),
    'the rest still hold records',
  );
  const sizeLeft = left.reduce((n, f) => n + statSync(join(dir, f)).size, 0);
  t.ok(sizeLeft < 200 * 100, 'about half the bytes are left');
  log.durable(200);
  t.same(files(dir), ['sbx_a.0.000000000201.spool'], 'one empty file named after the next number');
  t.equal(statSync(join(dir, 'sbx_a.0.000000000201.spool')).size, 0);
  t.equal(log.kept, 0);
  t.equal(log.inMemory.events, 0);
  t.equal(openUnder(dir), 0, 'and no file held open for it');
  log.close();
  const [again] = OutputLog.recover(recoverSpool(dir), { dir });
  t.equal(again?.push(line(201)), 201, 'after a restart numbering goes on from there');
});

t.test('after a restart the spool gives back every event not durable, and numbering continues', async (t) => {
  const dir = spoolDir();
  const log = new OutputLog('sbx_a', 2, { dir, segmentBytes: 3000 });
  for (let i = 1; i <= 150; i++) log.push(line(i));
  log.durable(40);
  log.close();
  const recovered = recoverSpool(dir);
  t.equal(recovered.length, 1);
  t.match(recovered[0], { sandbox: 'sbx_a', incarnation: 2, cutBytes: 0 });
  const [back] = OutputLog.recover(recovered, { dir, segmentBytes: 3000 });
  if (!back) throw new Error('nothing recovered');
  t.ok(back.kept >= 110 && back.kept < 150, `what was not durable, give or take a segment (${back.kept})`);
  t.equal(back.push(line(151)), 151);
  const frames = drain(back);
  const numbers = numbersOf(frames);
  t.equal(numbers.at(-1), 151);
  t.same(
    numbers,
    Array.from({ length: numbers.length }, (_, i) => (numbers[0] as number) + i),
    'without holes',
  );
  t.ok((numbers[0] as number) <= 41, 'from at or before the first event not durable');
  t.same(dataOf(frames).at(-2), line(150).data);
});

t.test('a record torn at the end of the spool is cut off at restart, the file truncated there', async (t) => {
  const dir = spoolDir();
  spoolOf(dir, 10);
  const [name] = files(dir);
  const path = join(dir, name as string);
  const starts = recordStarts(path);
  truncateSync(path, (starts[7] as number) + 20); // the 8th record stops in its payload
  const [r] = recoverSpool(dir);
  t.match(r, { records: 7, cutBytes: 20 });
  t.equal(statSync(path).size, starts[7], 'truncated at the last whole record');
  const [log] = OutputLog.recover(recoverSpool(dir), { dir });
  if (!log) throw new Error('nothing recovered');
  t.same(
    dataOf(drain(log)),
    Array.from({ length: 7 }, (_, i) => line(i + 1).data),
    'only the whole records are sent again',
  );
  t.equal(log.push(line(8)), 8, 'numbering continues after the good prefix');

  // A tear inside the header counts too.
  const dir2 = spoolDir();
  spoolOf(dir2, 3);
  const path2 = join(dir2, files(dir2)[0] as string);
  truncateSync(path2, (recordStarts(path2)[2] as number) + 5);
  t.match(recoverSpool(dir2)[0], { records: 2 });
});

t.test('a damaged byte in a payload is found by its CRC; that record and all after it are dropped', async (t) => {
  const dir = spoolDir();
  spoolOf(dir, 40, { segmentBytes: 1500 });
  const names = files(dir);
  t.ok(names.length >= 3, `several segments (${names.length})`);
  const path = join(dir, names[1] as string);
  const bytes = readFileSync(path);
  const starts = recordStarts(path);
  const victim = (starts[2] as number) + RECORD_HEADER_BYTES + 10;
  bytes[victim] = (bytes[victim] as number) ^ 0x40;
  writeFileSync(path, bytes);
  const firstSeq = Number(/\.(\d+)\.spool$/.exec(names[1] as string)?.[1]);
  const [r] = recoverSpool(dir);
  t.equal(r?.records, firstSeq - 1 + 2, 'the records before the damaged one');
  t.same(files(dir), names.slice(0, 2), 'later segments deleted');
  t.equal(statSync(path).size, starts[2]);
  const [log] = OutputLog.recover(recoverSpool(dir), { dir });
  if (!log) throw new Error('nothing recovered');
  t.same(
    dataOf(drain(log)),
    Array.from({ length: firstSeq + 1 }, (_, i) => line(i + 1).data),
  );
});

t.test('whatever happens to the bytes, a restart recovers exactly the records before the damage', async (t) => {
  await fc.assert(
    fc.property(
      fc.integer({ min: 1, max: 30 }),
      fc.nat(),
      fc.oneof(fc.constant('cut' as const), fc.constant('flip' as const)),
      fc.integer({ min: 1, max: 255 }),
      (n, where, how, mask) => {
        const dir = spoolDir();
        spoolOf(dir, n);
        const path = join(dir, files(dir)[0] as string);
        const starts = recordStarts(path);
        const bytes = readFileSync(path);
        const at = where % bytes.length;
        if (how === 'cut') writeFileSync(path, bytes.subarray(0, at));
        else {
          bytes[at] = (bytes[at] as number) ^ mask;
          writeFileSync(path, bytes);
        }
        // Records wholly before the damaged byte (or the cut) survive, no more.
        const whole = starts.slice(1).filter((end) => end <= at).length;
        const [log] = OutputLog.recover(recoverSpool(dir), { dir });
        if (!log) throw new Error('nothing recovered');
        const data = dataOf(drain(log));
        return (
          JSON.stringify(data) === JSON.stringify(Array.from({ length: whole }, (_, i) => line(i + 1).data)) &&
          statSync(path).size === starts[whole]
        );
      },
    ),
    { numRuns: 150 },
  );
  t.pass('the good prefix, exactly, in every case tried');
});

t.test('a sandbox id cannot reach outside the spool directory', async (t) => {
  const dir = spoolDir();
  const log = new OutputLog('../../etc/x.y', 0, { dir });
  log.push(line(1));
  log.close();
  t.same(files(dir), ['%2E%2E%2F%2E%2E%2Fetc%2Fx%2Ey.0.000000000001.spool']);
  t.match(recoverSpool(dir)[0], { sandbox: '../../etc/x.y', incarnation: 0, records: 1 });
});
