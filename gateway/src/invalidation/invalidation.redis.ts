import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { RedisClient } from '../redis.ts';
import type { Invalidations } from './invalidation.ts';

/**
 * Invalidations over Redis sharded pub/sub: one channel under its own hash tag, so it runs on a
 * single server and on a cluster alike. Pub/sub drops messages while a subscriber is away, so
 * every reconnect of the subscriber runs `onReset`: the node forgets everything rather than
 * trust what it may have missed. A message is `<node id> <account id>`; a node ignores its
 * own.
 */
export function redisInvalidations(o: {
  redis: RedisClient;
  subscriber: RedisClient;
  prefix: string;
  logger: Logger;
}): Invalidations {
  const node = randomBytes(8).toString('hex');
  const channel = `${o.prefix}{auth}:forget`;
  let forget: ((accountId: string) => void) | undefined;
  let reset: (() => void) | undefined;

  const onMessage = (ch: string, raw: string) => {
    if (ch !== channel) return;
    const space = raw.indexOf(' ');
    if (space < 0 || raw.slice(0, space) === node) return;
    forget?.(raw.slice(space + 1));
  };
  // ioredis subscribes again by itself after a reconnect (and a cluster rebuilds its per-master
  // subscribers); what was published meanwhile never arrives, so forget everything then.
  const resubscribed = () => reset?.();
  return {
    async publish(accountId) {
      await o.redis
        .spublish(channel, `${node} ${accountId}`)
        .catch((err: Error) => o.logger.warn({ err: { message: err.message } }, 'credential invalidations publish'));
    },
    async listen(onForget, onReset) {
      forget = onForget;
      reset = onReset;
      o.subscriber.on('smessage', onMessage);
      await o.subscriber.ssubscribe(channel);
      o.subscriber.on('ready', resubscribed);
      o.subscriber.on('subscribersReady', resubscribed);
    },
    async close() {
      o.subscriber.off('smessage', onMessage);
      o.subscriber.off('ready', resubscribed);
      o.subscriber.off('subscribersReady', resubscribed);
      forget = undefined;
      reset = undefined;
      await o.subscriber.sunsubscribe(channel).catch(() => {});
    },
  };
}
