import type { RunnerOutput } from '@svc/core';
import t from 'tap';
import { takeMerged } from '../../gateway/src/fabric/fabric.ts';

const frame = (sandbox: string, incarnation: number, seq: number, count: number, bytes = 0): RunnerOutput => ({
  t: 'output',
  sandbox,
  incarnation,
  seq,
  events: Array.from({ length: count }, (_, i) => ({
    conversation_id: 'cnv_1',
    kind: 'output' as const,
    stream: 'stdout' as const,
    data: bytes ? 'x'.repeat(bytes) : `${seq + i}`,
  })),
});

const dataOf = (m: RunnerOutput) => m.events.map((e) => e.data);

t.test('frames queued behind an append are appended as one when they continue its numbering', async (t) => {
  const outbox = [frame('sbx_a', 0, 1, 2), frame('sbx_a', 0, 3, 1), frame('sbx_a', 0, 4, 3)];
  const first = outbox[0];
  const m = takeMerged(outbox);
  t.equal(outbox.length, 0, 'all three taken');
  t.same({ sandbox: m.sandbox, incarnation: m.incarnation, seq: m.seq }, { sandbox: 'sbx_a', incarnation: 0, seq: 1 });
  t.same(dataOf(m), ['1', '2', '3', '4', '5', '6'], 'every event once, in arrival order');
  t.equal(first?.events.length, 2, 'the received frame itself is not changed');
});

t.test('a lone frame is returned as it came', async (t) => {
  const only = frame('sbx_a', 0, 7, 2);
  const outbox = [only];
  t.equal(takeMerged(outbox), only);
  t.equal(outbox.length, 0);
});

t.test('merging stops at another sandbox, another incarnation, a hole, an overlap, or the bound', async (t) => {
  const cases: [string, RunnerOutput][] = [
    ['another sandbox', frame('sbx_b', 0, 3, 1)],
    ['another incarnation', frame('sbx_a', 1, 3, 1)],
    ['a hole in the numbering', frame('sbx_a', 0, 4, 1)],
    ['a resend overlapping it', frame('sbx_a', 0, 2, 2)],
    ['past 1,000 events', frame('sbx_a', 0, 3, 999)],
  ];
  for (const [why, next] of cases) {
    const outbox = [frame('sbx_a', 0, 1, 2), next];
    const m = takeMerged(outbox);
    t.same(dataOf(m), ['1', '2'], `${why}: the first frame alone`);
    t.equal(outbox[0], next, `${why}: the next frame stays queued`);
  }
  const full = [frame('sbx_a', 0, 1, 2), frame('sbx_a', 0, 3, 998), frame('sbx_a', 0, 1001, 1)];
  t.equal(takeMerged(full).events.length, 1000, 'up to exactly 1,000 events');
  t.equal(full.length, 1);
  const big = [frame('sbx_a', 0, 1, 1, 600_000), frame('sbx_a', 0, 2, 1, 600_000)];
  t.equal(takeMerged(big).events.length, 1, 'not past 1 MiB of data');
  t.equal(big.length, 1);
});
