import { createLogger } from '@svc/gateway';
import { Redis } from 'ioredis';
import t from 'tap';
import { runnerRouterContract } from '../../gateway/src/fabric/router.contract.ts';
import { memoryRouterHub, memoryRunnerRouter } from '../../gateway/src/fabric/router.memory.ts';
import { redisRunnerRouter } from '../../gateway/src/fabric/router.redis.ts';

t.test('in-memory runner router contract', async (t) => {
  runnerRouterContract(t, () => {
    const hub = memoryRouterHub();
    return async (o) => memoryRunnerRouter({ ...o, hub });
  });
});

t.test('redis runner router contract', { skip: !process.env.TEST_REDIS_URL && 'no TEST_REDIS_URL' }, async (t) => {
  const url = process.env.TEST_REDIS_URL as string;
  // One command connection for every node: hold() does not wait for Redis, and one connection
  // keeps a hold ordered before the forward a test sends next from another node.
  const redis = new Redis(url);
  const subscribers: Redis[] = [];
  t.teardown(async () => {
    for (const s of subscribers) await s.quit();
    await redis.quit();
  });
  const logger = createLogger('silent');
  runnerRouterContract(t, () => {
    const prefix = `router${Math.random().toString(36).slice(2, 8)}:`;
    let started = 0;
    return async (o) => {
      const subscriber = new Redis(url);
      subscribers.push(subscriber);
      const router = redisRunnerRouter({ ...o, redis, subscriber, prefix, logger });
      started++;
      // Ready once its inbox and the marks channel are subscribed: one SSUBSCRIBE takes both.
      const deadline = Date.now() + 5000;
      for (;;) {
        const [, count] = (await redis.pubsub('SHARDNUMSUB', `${prefix}{fabric}:durable`)) as [string, number];
        if (count === started) return router;
        if (Date.now() > deadline) throw new Error('the router did not subscribe');
        await new Promise((r) => setTimeout(r, 10));
      }
    };
  });
});
