import { Redis } from 'ioredis';
import t from 'tap';
import { eventLogContract } from '../../gateway/src/log/log.contract.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { redisEventLog } from '../../gateway/src/log/log.redis.ts';

t.test('in-memory event log contract', async (t) => eventLogContract(t, () => memoryEventLog()));

t.test('in memory, an append in the millisecond of a drop still gets an id past the forgotten ones', async (t) => {
  // A clock that stands still: every id comes from `last + 1`, as in a burst within one ms.
  const log = memoryEventLog({ now: () => 1_000_000 });
  const event = { conversationId: 'c1', kind: 'output' as const, stream: 'stdout' as const, data: 'x' };
  const first = await log.append({ tenant: 'acc_a', producer: 'p', seq: 1, events: [event, event, event] });
  const last = first.events.at(-1)?.id as number;
  await log.dropTenant('acc_a');
  const again = await log.append({ tenant: 'acc_a', producer: 'p', seq: 1, events: [event] });
  t.ok((again.events[0]?.id as number) > last, `${again.events[0]?.id} comes after ${last}`);
});

t.test('redis event log contract', { skip: !process.env.TEST_REDIS_URL && 'no TEST_REDIS_URL' }, async (t) => {
  const url = process.env.TEST_REDIS_URL as string;
  const clients: Redis[] = [];
  t.teardown(async () => {
    for (const c of clients) await c.quit();
  });
  const prefix = `logtest${Math.random().toString(36).slice(2, 6)}:`;
  eventLogContract(
    t,
    () => {
      const redis = new Redis(url);
      const sub = new Redis(url);
      clients.push(redis, sub);
      return redisEventLog(redis, sub, { prefix });
    },
    {
      // Losing data: every key of this run is gone, counters and marks included.
      loseData: async () => {
        const r = new Redis(url);
        clients.push(r);
        const keys = await r.keys(`${prefix}*`);
        if (keys.length) await r.del(...keys);
      },
    },
  );
});

t.test('the write path redacts secrets, also split across appends, before anything is stored', async (t) => {
  const { createAppender, Redaction } = await import('../../gateway/src/log/log.append.ts');
  const { REDACTED } = await import('@svc/core');
  const secret = 'sk-live-0123456789abcdef';
  const adapters: [
    string,
    () => Promise<{ log: import('../../gateway/src/log/log.ts').EventLog; raw: () => Promise<string> }>,
  ][] = [
    [
      'memory',
      async () => {
        const log = memoryEventLog();
        return { log, raw: async () => JSON.stringify(await log.read('acme', { after: 0, limit: 100 })) };
      },
    ],
  ];
  if (process.env.TEST_REDIS_URL) {
    const url = process.env.TEST_REDIS_URL;
    adapters.push([
      'redis',
      async () => {
        const redis = new Redis(url);
        const sub = new Redis(url);
        t.teardown(async () => {
          await redis.quit();
          await sub.quit();
        });
        const prefix = `redact${Math.random().toString(36).slice(2, 6)}:`;
        const log = redisEventLog(redis, sub, { prefix });
        return {
          log,
          // Every byte of every key this log wrote.
          raw: async () => {
            const keys = await redis.keys(`${prefix}*`);
            const parts: string[] = [];
            for (const k of keys) {
              const type = await redis.type(k);
              if (type === 'stream') parts.push(JSON.stringify(await redis.xrange(k, '-', '+')));
              else if (type === 'string') parts.push((await redis.get(k)) ?? '');
            }
            return parts.join('\n');
          },
        };
      },
    ]);
  }
  for (const [name, make] of adapters) {
    t.test(name, async (t) => {
      const { log, raw } = await make();
      const redaction = new Redaction();
      redaction.register('acme', 'c1', [secret, 'short']);
      const appendEvents = createAppender(log, redaction);
      const out = (data: string) => ({ conversationId: 'c1', kind: 'output', stream: 'stdout', data });
      await appendEvents({ tenant: 'acme', producer: 'r', seq: 1, events: [out('export KEY=sk-live-0123')] });
      await appendEvents({ tenant: 'acme', producer: 'r', seq: 2, events: [out('456789abcdef; echo short')] });
      // A resend of the second chunk changes nothing.
      await appendEvents({ tenant: 'acme', producer: 'r', seq: 2, events: [out('456789abcdef; echo short')] });
      await appendEvents({
        tenant: 'acme',
        producer: 'r',
        seq: 3,
        events: [
          {
            conversationId: 'c1',
            kind: 'stage',
            stream: 'stage',
            stage: 'turn',
            state: 'done',
            data: `used ${secret}`,
          },
        ],
      });
      const events = await log.read('acme', { after: 0, limit: 100 });
      const stdout = events
        .filter((e) => e.stream === 'stdout')
        .map((e) => e.data)
        .join('');
      t.equal(stdout, `export KEY=${REDACTED}; echo short`, 'the joined output is whole, the secret replaced');
      t.equal(events.at(-1)?.kind, 'stage', 'held text was released before the stage event');
      t.equal(events.at(-1)?.data, `used ${REDACTED}`);
      const everything = await raw();
      t.notOk(everything.includes(secret), 'the value never reached the store');
      t.notOk(everything.includes('0123456789abcdef'), 'nor its pieces');
    });
  }
});
