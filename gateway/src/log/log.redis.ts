import { randomUUID } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import {
  type AppendInput,
  type AppendResult,
  clockMicros,
  type EventLog,
  type LiveBatch,
  type LoadMark,
  type LogEvent,
  type ReadOptions,
  seqsOf,
  storedFields,
  TRIM_SLACK,
  type TrimOptions,
  trimLimit,
} from './log.ts';

/**
 * One script per append, so ids, streams, the producer's mark and the live publish change
 * together or not at all. Every key is under the tenant's hash tag (Redis Cluster runs the
 * script on one shard). Entry ids are `<event id>-0`, so XRANGE answers Last-Event-ID directly.
 *
 * Each event carries its producer sequence number; several events may share one (the write
 * path can add an event, as redaction's flush does). Events at or below the producer's mark
 * are skipped; a batch whose first number is beyond mark + 1 is a gap.
 *
 * A producer without a mark in Redis (new, or Redis lost its data) may have one in Postgres:
 * the script answers `nomark` unless the caller passes what it loaded (`-`: none there), and
 * the caller asks again with it. A tenant event (no conversation) passes the tenant log as
 * its conversation key and is written once.
 *
 * The batch is published on the tenant's live channel for the nodes that follow it, unless
 * the caller follows it itself (`self` 1) and no other subscriber does: that node delivers
 * the batch to its watchers from this reply, and the round trip through pub/sub (Redis
 * writing the message, the node reading and parsing it back) is saved. Counting subscribers
 * in the script makes it exact against other nodes: a node that subscribes before it runs
 * is counted, one that subscribes after it reads its position after it, so the batch is its
 * history either way.
 *
 * KEYS: seq, tenant log, conversation stream, producer mark, live channel, trim point
 * ARGV: count, now (us), loaded mark ('' not loaded, '-' none), self (1: the caller's node
 *       is subscribed to the live channel, else 0), then count pairs of (seq, JSON payload
 *       without the id)
 * Returns: {status, mark, prev, published (1 or 0), (index, id) per appended event...}
 *
 * Exported for the bench, which runs this very script under redis-benchmark as the ceiling.
 */
export const APPEND = `
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local loaded = ARGV[3]
local first = tonumber(ARGV[5])
local last_seq = tonumber(ARGV[3 + 2 * n])
local mark = redis.call('GET', KEYS[4])
if not mark then
  if loaded == '' then return {'nomark'} end
  if loaded ~= '-' then mark = loaded end
end
local hwm = mark and tonumber(mark) or (first - 1)
if last_seq <= hwm then return {'duplicate', tostring(hwm)} end
if first > hwm + 1 then return {'gap', tostring(hwm)} end
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
if now > clock then clock = now end
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = last
local out = {'appended', tostring(last_seq), string.format('%.0f', prev), '0'}
local ids = {}
local payloads = {}
local own_stream = KEYS[3] ~= KEYS[2]
for i = 1, n do
  local s = tonumber(ARGV[3 + 2 * i])
  if s > hwm then
    last = math.max(last + 1, clock)
    local id = string.format('%.0f', last)
    local payload = ARGV[4 + 2 * i]
    redis.call('XADD', KEYS[2], id .. '-0', 'e', payload)
    if own_stream then redis.call('XADD', KEYS[3], id .. '-0', 'e', payload) end
    ids[#ids + 1] = id
    payloads[#payloads + 1] = payload
    out[#out + 1] = tostring(i)
    out[#out + 1] = id
  end
end
redis.call('SET', KEYS[1], string.format('%.0f', last))
redis.call('SET', KEYS[4], tostring(last_seq))
local cut = redis.call('GET', KEYS[6])
if cut and own_stream then redis.call('XTRIM', KEYS[3], 'MINID', '~', cut) end
if redis.call('PUBSUB', 'SHARDNUMSUB', KEYS[5])[2] > tonumber(ARGV[4]) then
  redis.call('SPUBLISH', KEYS[5], '{"prev":' .. string.format('%.0f', prev) .. ',"ids":[' .. table.concat(ids, ',') .. '],"events":[' .. table.concat(payloads, ',') .. ']}')
  out[4] = '1'
end
return out
`;

type Payload = Omit<LogEvent, 'id'>;

/** The Redis layout of DESIGN.md "Redis layout", behind an optional prefix. */
export function logKeys(prefix: string, tenant: string) {
  const tag = `${prefix}{t:${tenant}}`;
  return {
    seq: `${tag}:seq`,
    log: `${tag}:log`,
    conversation: (id: string) => `${tag}:c:${id}`,
    producer: (id: string) => `${tag}:p:${id}`,
    live: `${tag}:live`,
    /** Below this id the tenant's events live in Postgres only. */
    trim: `${tag}:trim`,
  };
}

/**
 * The Redis Streams adapter, on one server or a Redis Cluster. `redis` runs commands (on a
 * cluster each script runs on the shard of its tenant's hash tag); `subscriber` is a separate
 * connection for sharded pub/sub (a connection in subscriber mode runs nothing else). A
 * cluster subscriber must be made with `shardedSubscribers: true`: ioredis then keeps one
 * subscriber connection per master and sends each SSUBSCRIBE to the owner of its slot.
 * The subscriber serves this one event log: Redis counts subscribers by connection, and a
 * second log following the same tenant on it would not be counted apart (see APPEND).
 */
export function redisEventLog(
  redis: Redis | Cluster,
  subscriber: Redis | Cluster,
  options: { prefix?: string; loadMark?: LoadMark } = {},
): EventLog {
  const prefix = options.prefix ?? '';
  const loadMark = options.loadMark;
  const clustered = subscriber.isCluster;
  if (clustered && !(subscriber as Cluster).options.shardedSubscribers) {
    // Without it every SSUBSCRIBE goes to one node, and a channel it does not own answers MOVED.
    throw new Error('redisEventLog: a Cluster subscriber needs the option shardedSubscribers: true');
  }
  redis.defineCommand('svcLogAppend', { numberOfKeys: 6, lua: APPEND });
  const appendScript = (redis as unknown as Record<string, (...a: unknown[]) => Promise<string[]>>).svcLogAppend as (
    ...a: unknown[]
  ) => Promise<string[]>;

  async function read(tenant: string, o: ReadOptions): Promise<LogEvent[]> {
    const keys = logKeys(prefix, tenant);
    const key = o.conversationId ? keys.conversation(o.conversationId) : keys.log;
    const rows = (await redis.xrange(key, `(${o.after}-0`, '+', 'COUNT', o.limit)) as [string, string[]][];
    return rows.map(([entryId, fields]) => ({
      id: Number(entryId.slice(0, -2)),
      ...(JSON.parse(fields[1] as string) as Payload),
    }));
  }

  async function lastId(tenant: string): Promise<number> {
    return Number((await redis.get(logKeys(prefix, tenant).seq)) ?? 0);
  }

  // Live delivery: one subscription per tenant on this node, delivered in order. `delivered`
  // is the last id handed to subscribers; a batch whose `prev` is beyond it means something
  // was missed (a lost message, a resubscribe), and the hole is read from the stream first.
  interface Feed {
    handlers: Set<(b: LiveBatch) => void>;
    delivered: number;
    /** Every step of this feed, in order; it starts with `ready`. */
    queue: Promise<void>;
    /** Resolves once SSUBSCRIBE is confirmed and `delivered` is set. */
    ready: Promise<void>;
    /** Its first SSUBSCRIBE was confirmed: from then on, a resubscribe may have lost messages. */
    subscribed: boolean;
    /** A resubscribe step is queued and has not started (one is enough). */
    resubscribing: boolean;
    /**
     * The subscription is known to be live at Redis now and `delivered` is set: this node's
     * appends to the tenant may go unpublished when no other node follows it (APPEND). False
     * from the moment the subscriber connection closes until the feed is subscribed again.
     */
    confirmed: boolean;
  }
  const feeds = new Map<string, Feed>();
  // A producer's appends must run in the order they were made: a batch run before the one
  // ahead of it is a gap. They go out in that order on the one connection, except around a
  // mark load. Every append sent before the first retry finds no mark, and each sends its
  // retry when its own answer is back, which may come after the load is done and after the
  // producer made newer appends. So while a producer's mark is loaded, its appends queue:
  // each sends its retry (or, made meanwhile, its one try) once the one before it sent its
  // last.
  interface Producer {
    /** Its appends in flight. */
    inFlight: number;
    /** Resolves once the newest append has sent its last try, and so every earlier one. */
    sent: Promise<void>;
    /** The mark being loaded, while appends in flight still need it. */
    mark?: Promise<number | undefined>;
  }
  const producers = new Map<string, Producer>();
  const channelTenant = new Map<string, string>();
  // Appends that told the script this node follows the tenant (`self`), by tenant, while in
  // flight: the tenant's SUNSUBSCRIBE waits for them, since on its own connection it could
  // reach Redis first and make the script skip a publish another node needs.
  const selfAppends = new Map<string, number>();
  const unsubscribeLater = new Set<string>();
  // Closes of the subscriber connection so far: a subscription confirmed across one is not.
  let drops = 0;

  /** Ends the node's subscription to the tenant's channel, once no `self` append is in flight. */
  const leave = (tenant: string) => {
    const channel = logKeys(prefix, tenant).live;
    channelTenant.delete(channel);
    if (selfAppends.has(tenant)) unsubscribeLater.add(tenant);
    else void subscriber.sunsubscribe(channel).catch(() => {});
  };

  /**
   * The feed's SSUBSCRIBE, sent when the connection had closed `before` times, was answered:
   * the subscription is live unless the connection closed since (or the feed was replaced).
   */
  const confirm = (tenant: string, feed: Feed, before: number) => {
    feed.confirmed = drops === before && feeds.get(tenant) === feed;
  };

  /** A `self` append of the tenant is answered: a SUNSUBSCRIBE that waited for it goes now. */
  const selfDone = (tenant: string) => {
    const left = (selfAppends.get(tenant) ?? 1) - 1;
    if (left > 0) return void selfAppends.set(tenant, left);
    selfAppends.delete(tenant);
    if (unsubscribeLater.delete(tenant) && !feeds.has(tenant)) {
      void subscriber.sunsubscribe(logKeys(prefix, tenant).live).catch(() => {});
    }
  };

  /**
   * Runs one append's script in its producer's order (see Producer). `run` sends it with a
   * loaded mark ('' none loaded, '-' none there, else the mark): at once with none loaded,
   * unless the producer's mark is being loaded; a script that finds no mark runs again with it.
   */
  const inProducerOrder = async (
    tenant: string,
    producerId: string,
    run: (loaded: string) => Promise<string[]>,
  ): Promise<string[]> => {
    const key = `${tenant}\0${producerId}`;
    let p = producers.get(key);
    if (!p) {
      p = { inFlight: 0, sent: Promise.resolve() };
      producers.set(key, p);
    }
    p.inFlight++;
    const before = p.sent;
    let markSent = () => {};
    const sent = new Promise<void>((resolve) => {
      markSent = resolve;
    });
    p.sent = sent;
    const retry = async (mark: Promise<number | undefined>) => {
      await before;
      let loaded: number | undefined;
      try {
        loaded = await mark;
      } catch (err) {
        if (p.mark === mark) p.mark = undefined; // the next append that finds no mark loads again
        throw err;
      }
      const reply = run(loaded === undefined ? '-' : String(loaded));
      markSent();
      if (p.sent === sent) p.mark = undefined; // no newer append waits for it
      return reply;
    };
    try {
      if (p.mark) return await retry(p.mark);
      const out = await run(loadMark ? '' : '-');
      if (out[0] !== 'nomark') return out;
      p.mark ??= (loadMark as LoadMark)(tenant, producerId);
      return await retry(p.mark);
    } finally {
      void before.then(markSent);
      if (--p.inFlight === 0) producers.delete(key);
    }
  };

  const deliver = (tenant: string, feed: Feed, events: LogEvent[], prev: number) => {
    const fresh = events.filter((e) => e.id > feed.delivered);
    if (fresh.length === 0) return;
    const batch: LiveBatch = { tenant, prev, events: fresh };
    feed.delivered = (fresh.at(-1) as LogEvent).id;
    for (const h of feed.handlers) h(batch);
  };

  const fill = async (tenant: string, feed: Feed, upTo: number) => {
    while (feed.delivered < upTo) {
      const missing = await read(tenant, { after: feed.delivered, limit: 1000 });
      const within = missing.filter((e) => e.id <= upTo);
      if (within.length === 0) break;
      deliver(tenant, feed, within, feed.delivered);
    }
  };

  // A failed step (Redis unreachable for a moment) must not stall the feed: the next message,
  // or the next resubscribe, fills whatever it left out.
  const enqueue = (feed: Feed, step: () => Promise<void>) => {
    feed.queue = feed.queue.then(step).catch(() => {});
  };

  /**
   * A batch for the feed, from a message or from this node's own append: in the feed's order,
   * after whatever a `prev` beyond its position says it missed (read from the stream first).
   */
  const receive = (tenant: string, feed: Feed, events: LogEvent[], prev: number) => {
    enqueue(feed, async () => {
      if (prev > feed.delivered) await fill(tenant, feed, prev);
      deliver(tenant, feed, events, prev);
    });
  };

  // Probes this node published to learn when its subscription is live again (see below).
  const probes = new Map<string, () => void>();

  // The subscriber connection is shared with other users of sharded pub/sub (the fabric's
  // router, credential invalidations): a channel that is not a tenant's feed is not ours.
  subscriber.on('smessage', (channel: string, message: string) => {
    const tenant = channelTenant.get(channel);
    if (tenant === undefined) return;
    const parsed = JSON.parse(message) as { prev: number; ids: number[]; events: Payload[]; probe?: string };
    if (parsed.probe !== undefined) {
      probes.get(parsed.probe)?.();
      return;
    }
    const feed = feeds.get(tenant);
    if (!feed) return;
    const events = parsed.events.map((p, i) => ({ id: parsed.ids[i] as number, ...p }));
    receive(tenant, feed, events, parsed.prev);
  });

  /**
   * Resolves once a publish on `channel` reaches this node's subscriber, or after `ms`. The
   * probe is shaped as an empty batch, so any other node subscribed to the tenant drops it.
   */
  const probe = async (channel: string, ms: number) => {
    const nonce = randomUUID();
    let timer: NodeJS.Timeout | undefined;
    const heard = new Promise<void>((resolve) => {
      probes.set(nonce, resolve);
      timer = setTimeout(resolve, ms);
    });
    try {
      await redis.spublish(channel, JSON.stringify({ prev: 0, ids: [], events: [], probe: nonce }));
      await heard;
    } finally {
      clearTimeout(timer);
      probes.delete(nonce);
    }
  };

  // After a reconnect ioredis resubscribes silently, without waiting for the reply: on one
  // server when the connection is 'ready' again; on a cluster whenever it rebuilds its
  // per-master subscribers (a node came back, a slot moved and Redis sent SUNSUBSCRIBE), then
  // 'subscribersReady'. Each feed first makes sure its subscription is live again, then reads
  // from the stream whatever was published meanwhile, before anything newer is delivered.
  // - One server: SSUBSCRIBE again (a no-op for the server); its reply follows ioredis's own
  //   on the same connection.
  // - Cluster: the subscriber connection cannot be addressed directly, and every SSUBSCRIBE
  //   through ioredis appends the channel to its per-slot list again (a list that would grow
  //   with each reconnect). So publish a probe and wait for it to come back.
  // A feed whose first SSUBSCRIBE is still unanswered needs nothing: its position is read
  // after that reply (and a lazily connecting cluster emits 'subscribersReady' right then).
  // While a master is down ioredis rebuilds its group over and over; one queued step per feed
  // covers any number of those.
  const resubscribed = () => {
    for (const [tenant, feed] of feeds) {
      if (!feed.subscribed || feed.resubscribing) continue;
      feed.resubscribing = true;
      const channel = logKeys(prefix, tenant).live;
      enqueue(feed, async () => {
        feed.resubscribing = false;
        if (feeds.get(tenant) !== feed) return;
        if (clustered) await probe(channel, 2000);
        else {
          const before = drops;
          await subscriber.ssubscribe(channel);
          confirm(tenant, feed, before);
        }
        await fill(tenant, feed, await lastId(tenant));
      });
    }
  };
  subscriber.on(clustered ? 'subscribersReady' : 'ready', resubscribed);
  subscriber.on('close', () => {
    drops++;
    for (const feed of feeds.values()) feed.confirmed = false;
  });

  /**
   * The feed of `tenant` when this node may append to it as `self` (see APPEND): one server
   * only (a cluster's per-master subscribers give no single state to trust), its connection
   * ready and the subscription confirmed.
   */
  const selfFeed = (tenant: string): Feed | undefined => {
    if (clustered || subscriber.status !== 'ready') return undefined;
    const feed = feeds.get(tenant);
    return feed?.confirmed ? feed : undefined;
  };

  return {
    async append(input: AppendInput): Promise<AppendResult> {
      if (input.events.length === 0) return { status: 'duplicate', events: [], hwm: input.seq - 1 };
      const keys = logKeys(prefix, input.tenant);
      const conversations = new Set(input.events.map((e) => e.conversationId));
      if (conversations.size !== 1) throw new Error('one append carries one conversation');
      const conversationId = input.events[0]?.conversationId ?? null;
      const ts = new Date().toISOString();
      const seqs = seqsOf(input);
      const stored = input.events.map((e, i) => storedFields(e, ts, input.producer, seqs[i] as number));
      const pairs: (string | number)[] = [];
      for (let i = 0; i < stored.length; i++) pairs.push(seqs[i] as number, JSON.stringify(stored[i]));
      const feed = selfFeed(input.tenant);
      const run = (loaded: string) =>
        appendScript.call(
          redis,
          keys.seq,
          keys.log,
          conversationId === null ? keys.log : keys.conversation(conversationId),
          keys.producer(input.producer),
          keys.live,
          keys.trim,
          input.events.length,
          clockMicros(),
          loaded,
          feed ? 1 : 0,
          ...pairs,
        );
      let out: string[];
      if (feed) selfAppends.set(input.tenant, (selfAppends.get(input.tenant) ?? 0) + 1);
      try {
        out = await inProducerOrder(input.tenant, input.producer, run);
      } finally {
        if (feed) selfDone(input.tenant);
      }
      const [status, hwm, prev, published] = out as [string, string, string, string];
      if (status !== 'appended') return { status: status as 'duplicate' | 'gap', events: [], hwm: Number(hwm) };
      const events: LogEvent[] = [];
      for (let i = 4; i < out.length; i += 2) {
        // The fields as stored, not made again: the payload sent was their JSON.
        events.push({ id: Number(out[i + 1]), ...(stored[Number(out[i]) - 1] as Payload) });
      }
      // Unpublished: nobody else follows the tenant, and this node's watchers get the batch
      // from here, in order with what other nodes publish (a hole is read first, as for a
      // message). A feed that ended meanwhile needs nothing: its successor read its position
      // after this append.
      if (feed && published === '0' && feeds.get(input.tenant) === feed) {
        receive(input.tenant, feed, events, Number(prev));
      }
      return { status: 'appended', events, hwm: Number(hwm) };
    },

    read,
    lastId,

    async subscribe(tenant: string, onBatch: (b: LiveBatch) => void) {
      let feed = feeds.get(tenant);
      if (!feed) {
        const channel = logKeys(prefix, tenant).live;
        channelTenant.set(channel, tenant);
        const created: Feed = {
          handlers: new Set(),
          delivered: 0,
          queue: Promise.resolve(),
          ready: Promise.resolve(),
          subscribed: false,
          resubscribing: false,
          confirmed: false,
        };
        // A SUNSUBSCRIBE still waiting for appends is not needed any more.
        unsubscribeLater.delete(tenant);
        created.ready = (async () => {
          const before = drops;
          await subscriber.ssubscribe(channel);
          created.subscribed = true;
          // Only after the subscription is confirmed: everything up to here is history.
          created.delivered = await lastId(tenant);
          confirm(tenant, created, before);
        })();
        // Messages that arrive before the position is known wait for it (else the first
        // one's `prev` would be measured from 0 and the whole history delivered as live).
        created.queue = created.ready.catch(() => {});
        // A feed that never became ready is forgotten, so the next subscribe tries again.
        created.ready.catch(() => {
          if (feeds.get(tenant) !== created) return;
          feeds.delete(tenant);
          leave(tenant);
        });
        feed = created;
        feeds.set(tenant, feed);
      }
      const f = feed;
      f.handlers.add(onBatch);
      try {
        await f.ready;
      } catch (err) {
        f.handlers.delete(onBatch);
        throw err;
      }
      return () => {
        f.handlers.delete(onBatch);
        if (f.handlers.size === 0 && feeds.get(tenant) === f) {
          feeds.delete(tenant);
          leave(tenant);
        }
      };
    },

    async trim(tenant: string, o: TrimOptions) {
      const keys = logKeys(prefix, tenant);
      // Once the tail has grown a tenth past `keep` it is cut back to `keep`: a pass costs one
      // XLEN, and the boundary (the oldest entry kept) is read past only the entries that go.
      // (Reading the newest `keep` entries instead moved the whole hot tail through this
      // node's event loop at every copy pass, between the deliveries it makes.)
      const length = await redis.xlen(keys.log);
      const excess = length - o.keep;
      if (excess <= 0 || excess <= Math.floor(o.keep / TRIM_SLACK)) return;
      const limit = await trimLimit(o, length, async (index) => {
        const rows = (await redis.xrange(keys.log, '-', '+', 'COUNT', index + 1)) as [string, string[]][];
        return Number((rows.at(-1) as [string, string[]])[0].slice(0, -2));
      });
      const going = (await redis.xrange(keys.log, '-', `(${limit}-0`, 'COUNT', excess + 1)) as [string, string[]][];
      if (going.length === 0) return;
      // The entry past the `excess` oldest is the oldest `keep` holds: it and what follows stay.
      const kept = going[excess];
      const cut = kept ? Number(kept[0].slice(0, -2)) : limit;
      // The trim point first: a reader that finds the events gone also finds the point moved.
      await redis.set(keys.trim, String(cut));
      await redis.xtrim(keys.log, 'MINID', cut);
    },

    async floor(tenant: string) {
      return Number((await redis.get(logKeys(prefix, tenant).trim)) ?? 0);
    },

    async dropTenant(tenant: string) {
      const keys = logKeys(prefix, tenant);
      const feed = feeds.get(tenant);
      if (feed) {
        feeds.delete(tenant);
        channelTenant.delete(keys.live);
        feed.handlers.clear();
        await subscriber.sunsubscribe(keys.live).catch(() => {});
      }
      // Every key of the tenant carries its hash tag, so one slot, on one master of a cluster,
      // holds them all; SCAN finds the conversation streams and producer marks by name.
      const pattern = `${`${prefix}{t:${tenant}}`.replace(/[*?[\]\\]/g, '\\$&')}:*`;
      const nodes = redis.isCluster ? (redis as Cluster).nodes('master') : [redis as Redis];
      for (const node of nodes) {
        let cursor = '0';
        do {
          const [next, found] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
          cursor = next;
          if (found.length) await node.unlink(...found);
        } while (cursor !== '0');
      }
    },

    async close() {
      feeds.clear();
    },
  };
}
