import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import type { RedisClient } from '../redis.ts';
import type { Invalidations } from './invalidation.ts';

/** How long a reconnected node waits to hear its own probe before it trusts the channel anyway. */
const PROBE_MS = 2000;
/** How soon a publish that failed is tried again (and again, until Redis takes it). */
const RETRY_MS = 500;

/**
 * Invalidations over Redis sharded pub/sub: one channel under its own hash tag, so it runs on a
 * single server and on a cluster alike. A message is `<node id> <account id>`; a node ignores
 * its own.
 *
 * Nothing is taken on trust:
 * - Pub/sub drops messages while a subscriber is away. After a reconnect ioredis subscribes
 *   again by itself, but only after it says `ready`; so the node forgets everything at once,
 *   makes sure its subscription is live again (SSUBSCRIBE once more on one server, its own
 *   probe coming back on a cluster, as the event log does), and forgets everything once more,
 *   which covers what was published while it was not yet listening.
 * - A publish Redis did not take (a connection down) is kept and sent again every RETRY_MS
 *   until it is, so the other nodes hear it late rather than never.
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
  const probes = new Map<string, () => void>();
  const unsent = new Set<string>();
  let retry: NodeJS.Timeout | undefined;
  let closed = false;

  const onMessage = (ch: string, raw: string) => {
    if (ch !== channel) return;
    const space = raw.indexOf(' ');
    if (space < 0) return;
    const body = raw.slice(space + 1);
    if (raw.slice(0, space) === node) {
      if (body.startsWith('probe:')) probes.get(body)?.();
      return;
    }
    forget?.(body);
  };

  /** Resolves once the subscription is live again (or after PROBE_MS). */
  const confirmSubscribed = async () => {
    if (!o.subscriber.isCluster) {
      await o.subscriber.ssubscribe(channel);
      return;
    }
    const probe = `probe:${randomBytes(8).toString('hex')}`;
    let timer: NodeJS.Timeout | undefined;
    const heard = new Promise<void>((resolve) => {
      probes.set(probe, resolve);
      timer = setTimeout(resolve, PROBE_MS);
    });
    try {
      await o.redis.spublish(channel, `${node} ${probe}`);
      await heard;
    } finally {
      clearTimeout(timer);
      probes.delete(probe);
    }
  };
  const resubscribed = () => {
    reset?.();
    confirmSubscribed().then(
      () => reset?.(),
      (err: Error) => {
        o.logger.warn({ err: { message: err.message } }, 'credential invalidations resubscribe');
        reset?.();
      },
    );
  };

  const send = async () => {
    for (const accountId of [...unsent]) {
      try {
        await o.redis.spublish(channel, `${node} ${accountId}`);
        unsent.delete(accountId);
      } catch (err) {
        o.logger.warn({ err: { message: (err as Error).message } }, 'credential invalidations publish; will retry');
        break;
      }
    }
    if (unsent.size > 0 && !retry && !closed) {
      retry = setTimeout(() => {
        retry = undefined;
        void send();
      }, RETRY_MS);
      retry.unref();
    }
  };

  return {
    async publish(accountId) {
      unsent.add(accountId);
      await send();
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
      closed = true;
      clearTimeout(retry);
      o.subscriber.off('smessage', onMessage);
      o.subscriber.off('ready', resubscribed);
      o.subscriber.off('subscribersReady', resubscribed);
      forget = undefined;
      reset = undefined;
      await o.subscriber.sunsubscribe(channel).catch(() => {});
    },
  };
}
