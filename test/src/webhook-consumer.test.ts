import { conversations } from '@svc/db';
import { Redis } from 'ioredis';
import t from 'tap';
import { consumerGroupsContract } from '../../gateway/src/log/consumer.contract.ts';
import { memoryConsumerGroups } from '../../gateway/src/log/consumer.memory.ts';
import { redisConsumerGroups } from '../../gateway/src/log/consumer.redis.ts';
import { memoryEventLog } from '../../gateway/src/log/log.memory.ts';
import { redisEventLog } from '../../gateway/src/log/log.redis.ts';
import { backends, signUp, startTestService } from './harness.ts';

for (const backend of backends()) {
  t.test(`consumer groups on ${backend === 'embedded' ? 'memory' : 'redis'}`, async (t) => {
    const svc = await startTestService(t, { backend });
    const { sql } = svc.db;
    const clients: Redis[] = [];
    t.teardown(async () => {
      for (const c of clients) await c.quit();
    });
    const make = () => {
      if (backend === 'embedded') {
        const log = memoryEventLog();
        return { log, groups: memoryConsumerGroups(log) };
      }
      const url = process.env.TEST_REDIS_URL as string;
      const redis = new Redis(url);
      const sub = new Redis(url);
      clients.push(redis, sub);
      const prefix = `groups${Math.random().toString(36).slice(2, 6)}:`;
      return { log: redisEventLog(redis, sub, { prefix }), groups: redisConsumerGroups(redis, { prefix }), prefix };
    };
    const tenant = async () => {
      const { accountId } = await signUp(svc);
      for (const c of ['c1', 'c2']) {
        await conversations.insertConversation(sql, {
          id: `${accountId}-${c}`,
          accountId,
          agentId: 'agt_x',
          title: '',
          source: 'ui',
        });
      }
      return accountId;
    };
    const loseHotState = async (parts: ReturnType<typeof make>) => {
      if (backend === 'embedded') return make();
      // Every key of the run's prefix goes: streams, groups, counters, trim points.
      const prefix = (parts as { prefix?: string }).prefix as string;
      const redis = clients[0] as Redis;
      const keys = await redis.keys(`${prefix}*`);
      if (keys.length) await redis.del(...keys);
      return parts;
    };
    consumerGroupsContract(t, { sql, make, tenant, loseHotState });
  });
}
