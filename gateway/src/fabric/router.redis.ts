import { randomBytes } from 'node:crypto';
import { ApiError, type RunnerCommandBody } from '@svc/core';
import type { Logger } from 'pino';
import type { RedisClient } from '../redis.ts';
import { type RouterNodeOptions, type RunnerRouter, type RunnerSelector, relayedError } from './router.ts';

type Message =
  | { t: 'cmd'; id: string; from: string; runner: string; body: RunnerCommandBody }
  | { t: 'ack'; id: string }
  | { t: 'err'; id: string; code: string; message: string }
  | { t: 'durable'; from: string; marks: [string, number][] }
  | { t: 'disconnect'; from: string; who: RunnerSelector; code: number; reason: string };

// Compare-and-delete: only the holder's own claim goes.
const RELEASE = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`;

/**
 * The router over Redis: `runner:<id>` names the node holding it (expiring unless heartbeats
 * renew it), each node listens on its own channel for commands and answers, and marks and
 * disconnections go out on one channel every node hears (a node ignores a kind of
 * message it does not know, so nodes of the previous release share the channel). Sharded
 * pub/sub with one hash tag, so it runs on a single server and on a cluster alike.
 */
export function redisRunnerRouter(
  o: RouterNodeOptions & { redis: RedisClient; subscriber: RedisClient; prefix: string; logger: Logger },
): RunnerRouter {
  const node = randomBytes(8).toString('hex');
  const tag = `${o.prefix}{fabric}`;
  const key = (runnerId: string) => `${tag}:runner:${runnerId}`;
  const inbox = (n: string) => `${tag}:node:${n}`;
  const broadcast = `${tag}:durable`;
  const waiting = new Map<string, { resolve(): void; reject(err: Error): void; timer: NodeJS.Timeout }>();
  const send = (channel: string, m: Message) =>
    o.redis
      .spublish(channel, JSON.stringify(m))
      .catch((err: Error) => o.logger.warn({ err: { message: err.message } }, 'fabric router publish'));

  const onMessage = (channel: string, raw: string) => {
    if (channel !== inbox(node) && channel !== broadcast) return;
    let m: Message;
    try {
      m = JSON.parse(raw) as Message;
    } catch {
      return;
    }
    if (m.t === 'cmd') {
      o.run(m.runner, m.body).then(
        () => send(inbox(m.from), { t: 'ack', id: m.id }),
        (err: Error) =>
          send(inbox(m.from), {
            t: 'err',
            id: m.id,
            code: err instanceof ApiError ? err.code : 'runner_offline',
            message: err.message,
          }),
      );
    } else if (m.t === 'ack' || m.t === 'err') {
      const w = waiting.get(m.id);
      if (!w) return;
      waiting.delete(m.id);
      clearTimeout(w.timer);
      if (m.t === 'ack') w.resolve();
      else w.reject(relayedError(m.code, m.message));
    } else if (m.t === 'durable' && m.from !== node) {
      o.onDurable(new Map(m.marks));
    } else if (m.t === 'disconnect' && m.from !== node) {
      o.onDisconnect(m.who, m.code, m.reason);
    }
  };
  o.subscriber.on('smessage', onMessage);
  const subscribe = () =>
    o.subscriber
      .ssubscribe(inbox(node), broadcast)
      .catch((err: Error) => o.logger.warn({ err: { message: err.message } }, 'fabric router subscribe'));
  const subscribed = subscribe();
  o.subscriber.on('ready', subscribe);
  o.subscriber.on('subscribersReady', subscribe);

  return {
    hold(runnerId) {
      o.redis
        .set(key(runnerId), node, 'PX', o.holdMs)
        .catch((err: Error) => o.logger.warn({ err: { message: err.message } }, 'fabric router hold'));
    },
    release(runnerId) {
      o.redis
        .eval(RELEASE, 1, key(runnerId), node)
        .catch((err: Error) => o.logger.warn({ err: { message: err.message } }, 'fabric router release'));
    },
    async forward(runnerId, body) {
      await subscribed;
      const holder = await o.redis.get(key(runnerId));
      if (!holder || holder === node) throw new ApiError('runner_offline');
      const id = randomBytes(8).toString('hex');
      const acked = new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          waiting.delete(id);
          reject(new ApiError('runner_offline', 'The runner did not acknowledge the command in time.'));
        }, o.timeoutMs);
        timer.unref();
        waiting.set(id, { resolve, reject, timer });
      });
      await send(inbox(holder), { t: 'cmd', id, from: node, runner: runnerId, body });
      return acked;
    },
    durable(marks) {
      if (marks.size === 0) return;
      void send(broadcast, { t: 'durable', from: node, marks: [...marks] });
    },
    async disconnect(who, code, reason) {
      await send(broadcast, { t: 'disconnect', from: node, who, code, reason });
    },
    async close() {
      o.subscriber.off('smessage', onMessage);
      o.subscriber.off('ready', subscribe);
      o.subscriber.off('subscribersReady', subscribe);
      for (const w of waiting.values()) {
        clearTimeout(w.timer);
        w.reject(new ApiError('runner_offline', 'The service is shutting down.'));
      }
      waiting.clear();
      await o.subscriber.sunsubscribe(inbox(node), broadcast).catch(() => {});
    },
  };
}
