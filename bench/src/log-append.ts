/**
 * Appends per second on one node, through the single write path, against the in-memory log
 * and a Redis server (REDIS_URL), for single-event appends and batches of ten; several
 * producers append concurrently to one tenant, as runners do. Prints a table and writes
 * bench/reports/log-append-<time>.{json,md}.
 *
 *   REDIS_URL=redis://127.0.0.1:6379 npm run bench:log -- [--events 50000] [--producers 8]
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { createAppender, Redaction } from '../../gateway/src/log/log.append.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { redisEventLog } from '../../gateway/src/log/log.redis.ts';
import type { EventLog } from '../../gateway/src/log/log.ts';

const { values } = parseArgs({
  options: { events: { type: 'string', default: '50000' }, producers: { type: 'string', default: '8' } },
});
const total = Number(values.events);
const producers = Number(values.producers);

async function measure(log: EventLog, batch: number): Promise<number> {
  const redaction = new Redaction();
  await redaction.register('bench', 'c', ['a-secret-value-1234']);
  const append = createAppender(log, redaction);
  const perProducer = Math.floor(total / producers / batch);
  const started = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: producers }, async (_, p) => {
      for (let i = 0; i < perProducer; i++) {
        const events = Array.from({ length: batch }, (_, k) => ({
          conversationId: 'c',
          kind: 'output',
          stream: 'stdout',
          data: `producer ${p} line ${i * batch + k} of some typical output length\n`,
        }));
        await append({ tenant: 'bench', producer: `p${p}`, seq: i * batch + 1, events });
      }
    }),
  );
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  return (perProducer * batch * producers) / seconds;
}

const rows: { store: string; batch: number; eventsPerSecond: number }[] = [];
for (const batch of [1, 10])
  rows.push({ store: 'memory', batch, eventsPerSecond: await measure(memoryEventLog(), batch) });
if (process.env.REDIS_URL) {
  const redis = new Redis(process.env.REDIS_URL);
  const sub = new Redis(process.env.REDIS_URL);
  for (const batch of [1, 10]) {
    const prefix = `bench${Date.now()}:`;
    rows.push({ store: 'redis', batch, eventsPerSecond: await measure(redisEventLog(redis, sub, { prefix }), batch) });
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length) await redis.del(...keys);
  }
  await redis.quit();
  await sub.quit();
}
const lines = [
  `# Log appends on one node (${new Date().toISOString()})`,
  '',
  `${total} events, ${producers} producers appending concurrently to one tenant, through the write path (redaction on); Node ${process.version}.`,
  '',
  '| store | events per append | events/s |',
  '|---|---|---|',
  ...rows.map((r) => `| ${r.store} | ${r.batch} | ${Math.round(r.eventsPerSecond)} |`),
];
const report = lines.join('\n');
process.stdout.write(`${report}\n`);
const dir = join(fileURLToPath(new URL('../../', import.meta.url)), 'bench/reports');
mkdirSync(dir, { recursive: true });
const stamp = new Date().toISOString().replace(/[:.]/g, '-');
writeFileSync(join(dir, `log-append-${stamp}.json`), `${JSON.stringify({ total, producers, rows }, null, 2)}\n`);
writeFileSync(join(dir, `log-append-${stamp}.md`), `${report}\n`);
