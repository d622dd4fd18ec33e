import { Redis } from 'ioredis';
import t from 'tap';
import { eventLogContract } from '../../gateway/src/log/log.contract.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { redisEventLog } from '../../gateway/src/log/log.redis.ts';

t.test('in-memory event log contract', async (t) => eventLogContract(t, () => memoryEventLog()));

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
      return redisEventLog(redis, sub, prefix);
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
