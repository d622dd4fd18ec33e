import { Cluster, type ClusterOptions, Redis, type RedisOptions } from 'ioredis';
import type { Logger } from 'pino';
import { type Config, ConfigError } from './config.ts';

/** A single Redis server or a Redis Cluster; the log and the rate limiter take either. */
export type RedisClient = Redis | Cluster;

export interface RedisConnections {
  /** Commands: the log's script and reads, the rate limiter. */
  redis: RedisClient;
  /** Sharded pub/sub only (a connection in subscriber mode runs nothing else). */
  subscriber: RedisClient;
  /** Quits both. */
  close(): Promise<void>;
}

const invalid = (variable: string, message: string) =>
  new ConfigError(`invalid configuration:\n  ${variable}: ${message}`);

/**
 * The log and bus need Redis 7.0 or newer (sharded pub/sub, XADD options) and must never have
 * keys evicted; refuse to start otherwise, naming the setting. On a cluster each master holds
 * its own tenants' logs, so each is checked (`where` names it).
 */
async function checkServer(node: Redis, where: string): Promise<void> {
  const version = /redis_version:(\d+)\.(\d+)/.exec(await node.info('server'));
  if (!version || Number(version[1]) < 7) {
    const found = version ? `${version[1]}.${version[2]}` : 'unknown';
    throw invalid('REDIS_URL', `Redis 7.0 or newer is required (found ${found}${where})`);
  }
  const policy = /maxmemory_policy:(\S+)/.exec(await node.info('memory'))?.[1];
  if (policy !== 'noeviction') {
    throw invalid(
      'REDIS_URL',
      `the server must run with maxmemory-policy noeviction (it has ${policy ?? 'unknown'}${where})`,
    );
  }
}

/** `redis://[user:pass@]host:port`, comma-separated: the cluster's seed nodes and their credentials. */
function parseSeeds(value: string): { nodes: { host: string; port: number }[]; redisOptions: RedisOptions } {
  const redisOptions: RedisOptions = {};
  const nodes = value
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((seed) => {
      let url: URL;
      try {
        url = new URL(seed);
      } catch {
        throw invalid(
          'REDIS_URL',
          `with REDIS_CLUSTER=true, each comma-separated seed must be a redis:// URL: ${seed}`,
        );
      }
      if (url.protocol !== 'redis:' && url.protocol !== 'rediss:') {
        throw invalid('REDIS_URL', `a seed must be redis:// or rediss:// (got ${url.protocol}//)`);
      }
      // Every node the cluster names is reached with the same credentials and TLS as the seeds.
      if (url.username) redisOptions.username = decodeURIComponent(url.username);
      if (url.password) redisOptions.password = decodeURIComponent(url.password);
      if (url.protocol === 'rediss:') redisOptions.tls = {};
      return { host: url.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(url.port || 6379) };
    });
  if (nodes.length === 0) throw invalid('REDIS_URL', 'names no seed node');
  return { nodes, redisOptions };
}

/**
 * Opens the command connection and the subscriber connection REDIS_URL names and checks the
 * server(s). With REDIS_CLUSTER=true, REDIS_URL lists seed nodes and both are `Cluster`s: the
 * subscriber has ioredis's `shardedSubscribers`, one subscriber connection per master, so an
 * SSUBSCRIBE goes to the node owning its channel's slot (a plain Cluster sends every
 * subscription to one node, which answers MOVED for the slots it does not own).
 */
export async function connectRedis(config: Config, log: Logger): Promise<RedisConnections> {
  const url = config.REDIS_URL;
  if (!url) throw invalid('REDIS_URL', 'required');
  if (!config.REDIS_CLUSTER) {
    const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 2 });
    try {
      await redis.connect();
      // A cluster node answers MOVED for most keys; say so at start rather than on the first append.
      if (/cluster_enabled:1/.test(await redis.info('cluster'))) {
        throw invalid('REDIS_CLUSTER', 'REDIS_URL is a Redis Cluster node: set REDIS_CLUSTER=true');
      }
      await checkServer(redis, '');
    } catch (err) {
      redis.disconnect();
      throw err;
    }
    return connections(redis, redis.duplicate());
  }

  const { nodes, redisOptions } = parseSeeds(url);
  const options: ClusterOptions = {
    lazyConnect: true,
    // Reads of history go to the master: a lagging replica would be a hole (DESIGN.md).
    scaleReads: 'master',
    redisOptions: { ...redisOptions, maxRetriesPerRequest: 2 },
  };
  const redis = new Cluster(nodes, options);
  // Why joining failed arrives as an 'error' event (e.g. "cluster support disabled" when
  // REDIS_URL is a plain server); connect() itself only says no seed was usable.
  let lastError = '';
  redis.on('error', (err: Error & { lastNodeError?: Error }) => {
    lastError = err.lastNodeError?.message ?? err.message;
    log.warn({ err }, 'redis cluster');
  });
  try {
    await redis.connect();
    const masters = redis.nodes('master');
    for (const node of masters) await checkServer(node, ` on ${node.options.host}:${node.options.port}`);
  } catch (err) {
    redis.disconnect();
    if (err instanceof ConfigError) throw err;
    const seeds = nodes.map((n) => `${n.host}:${n.port}`).join(', ');
    throw invalid('REDIS_URL', `could not join a Redis Cluster at ${seeds}: ${lastError || (err as Error).message}`);
  }
  const subscriber = new Cluster(nodes, { ...options, shardedSubscribers: true });
  // A per-master subscriber that cannot (re)connect is reported as an 'error' event on the
  // Cluster: log it. The event log re-reads what it missed once the subscriber is back.
  subscriber.on('error', (err: Error) => log.warn({ err }, 'redis cluster subscriber'));
  return connections(redis, subscriber);
}

/** The pair as one handle; `close` quits the subscriber before the command connection. */
function connections(redis: RedisClient, subscriber: RedisClient): RedisConnections {
  return {
    redis,
    subscriber,
    async close() {
      await subscriber.quit();
      await redis.quit();
    },
  };
}
