/**
 * What writing every runner event ahead to the spool costs: events per second through
 * OutputLog as the runner-agent drives it (push, a frame per batch as a flush would send it,
 * `appended` and `durable` as the service answers), with the write-ahead spool, against the
 * memory-only OutputLog it replaced. Prints a table.
 *
 *   npm run bench:spool -- [--events 200000] [--batch 50] [--size 80]
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { RunnerEvent, RunnerOutput } from '@svc/core';
import { OutputLog } from '../../runner-agent/src/output.ts';

const { values } = parseArgs({
  options: {
    events: { type: 'string', default: '200000' },
    batch: { type: 'string', default: '50' },
    size: { type: 'string', default: '80' },
  },
});
const total = Number(values.events);
const batch = Number(values.batch);

/** The OutputLog before the spool (memory only, unbounded), kept here as the baseline. */
class MemoryOnlyLog {
  private next = 1;
  private pending: RunnerEvent[] = [];
  private base = 1;
  private sent = 0;
  push(event: RunnerEvent): number {
    this.pending.push(event);
    return this.next++;
  }
  unsent(): RunnerOutput[] {
    const frames: RunnerOutput[] = [];
    let from = Math.max(this.sent + 1, this.base);
    while (from < this.next) {
      const start = from - this.base;
      const events = this.pending.slice(start, start + 500);
      frames.push({ t: 'output', sandbox: 's', incarnation: 0, seq: from, events });
      from += events.length;
    }
    this.sent = this.next - 1;
    return frames;
  }
  appended(hwm: number): void {
    if (hwm < this.sent) this.sent = Math.max(hwm, this.base - 1);
  }
  durable(seq: number): void {
    const drop = Math.min(seq, this.next - 1) - this.base + 1;
    if (drop <= 0) return;
    this.pending.splice(0, drop);
    this.base += drop;
  }
}

type Log = Pick<OutputLog, 'push' | 'unsent' | 'appended' | 'durable'>;

function measure(log: Log, size: number): number {
  const line = `${'x'.repeat(Math.max(0, size - 1))}\n`;
  const started = process.hrtime.bigint();
  for (let i = 1; i <= total; i++) {
    log.push({ conversation_id: 'cnv_bench', turn_id: 'trn_bench', kind: 'output', stream: 'stdout', data: line });
    if (i % batch === 0) {
      for (const f of log.unsent()) log.appended(f.seq + f.events.length - 1);
      // The copy catches up a few batches behind.
      if (i % (batch * 20) === 0) log.durable(i - batch * 5);
    }
  }
  return total / (Number(process.hrtime.bigint() - started) / 1e9);
}

const rows: string[] = [];
for (const size of [Number(values.size), 4096]) {
  const dir = mkdtempSync(join(tmpdir(), 'svc-spool-bench-'));
  try {
    const memory = measure(new MemoryOnlyLog(), size);
    const spooled = new OutputLog('sbx_bench', 0, { dir });
    const ahead = measure(spooled, size);
    spooled.close();
    rows.push(
      `| ${size} | ${Math.round(memory)} | ${Math.round(ahead)} | ${((1 / ahead - 1 / memory) * 1e6).toFixed(2)} |`,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
process.stdout.write(
  [
    `# OutputLog: memory only vs write-ahead spool (${new Date().toISOString()}, Node ${process.version})`,
    '',
    `${total} events, a frame every ${batch}, durable every ${batch * 20}; spool in ${tmpdir()}.`,
    '',
    '| event data bytes | memory only, events/s | write-ahead spool, events/s | µs added per event |',
    '|---|---|---|---|',
    ...rows,
    '',
  ].join('\n'),
);
