import type { RedisClient } from '../redis.ts';
import type { ConsumerGroups, GroupRead } from './consumer.ts';
import { logKeys } from './log.redis.ts';
import type { LogEvent } from './log.ts';

type Payload = Omit<LogEvent, 'id'>;

/** The group's position (the id of its last-delivered entry), nil without the stream or the group. */
const POSITION = `
local function position(key, group)
  if redis.call('EXISTS', key) == 0 then return nil end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local name, last
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
    end
    if name == group then return tonumber(string.match(last, '^(%d+)')) end
  end
  return nil
end
`;

/**
 * One script, so a trim cannot fall between the look at the trim point and the read: the trim
 * point is set before entries go, and XREADGROUP alone would skip trimmed entries silently.
 * KEYS: tenant log, trim point. ARGV: group, consumer, count.
 * Returns {'missing'} | {'behind', position, trim point} | {'read', (entry id, payload)...}.
 */
const READ = `${POSITION}
local pos = position(KEYS[1], ARGV[1])
if not pos then return {'missing'} end
local floor = tonumber(redis.call('GET', KEYS[2]) or '0')
if floor > pos + 1 then return {'behind', string.format('%.0f', pos), string.format('%.0f', floor)} end
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
local out = {'read'}
if r then
  for _, entry in ipairs(r[1][2]) do
    out[#out + 1] = entry[1]
    out[#out + 1] = entry[2][2]
  end
end
return out
`;

/** KEYS: tenant log. ARGV: group, from, to. Sets the position to `to` if it is `from`; 1 when it did. */
const ADVANCE = `${POSITION}
if position(KEYS[1], ARGV[1]) ~= tonumber(ARGV[2]) then return 0 end
redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], ARGV[3] .. '-0')
return 1
`;

/** KEYS: tenant log. ARGV: group. The lowest id the group still needs, nil without a group. */
const HOLD = `${POSITION}
local pos = position(KEYS[1], ARGV[1])
if not pos then return nil end
local hold = pos + 1
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
if pending[1] > 0 then
  local oldest = tonumber(string.match(pending[2], '^(%d+)'))
  if oldest < hold then hold = oldest end
end
return string.format('%.0f', hold)
`;

/**
 * KEYS: tenant log. ARGV: group, idle ms. Forgets the group's consumers that hold nothing and
 * were idle that long: each process names a consumer of its own, so a dead one's name would
 * stay forever. A script, so no read hands one of them an entry between the look and the
 * removal (a live consumer removed this way is made again by its next read).
 */
const PRUNE = `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end
local removed = 0
for _, c in ipairs(consumers) do
  local name, pending, idle
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1] elseif c[i] == 'pending' then pending = c[i + 1] elseif c[i] == 'idle' then idle = c[i + 1] end
  end
  if pending == 0 and idle >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    removed = removed + 1
  end
end
return removed
`;

const idOf = (entryId: string) => Number(entryId.slice(0, -2));

/**
 * Redis Streams consumer groups on each tenant's log stream (`{t:<tenant>}:log`), named
 * `group`. Consumers are named by the caller; a consumer that dies leaves its pending entries
 * to XAUTOCLAIM. Every key stays under the tenant's hash tag, so the scripts run on a cluster.
 */
export function redisConsumerGroups(
  redis: RedisClient,
  options: { prefix?: string; group?: string } = {},
): ConsumerGroups {
  const prefix = options.prefix ?? '';
  const group = options.group ?? 'webhooks';
  redis.defineCommand('svcGroupRead', { numberOfKeys: 2, lua: READ });
  redis.defineCommand('svcGroupAdvance', { numberOfKeys: 1, lua: ADVANCE });
  redis.defineCommand('svcGroupHold', { numberOfKeys: 1, lua: HOLD });
  redis.defineCommand('svcGroupPrune', { numberOfKeys: 1, lua: PRUNE });
  const scripts = redis as unknown as Record<
    'svcGroupRead' | 'svcGroupAdvance' | 'svcGroupHold' | 'svcGroupPrune',
    (...a: (string | number)[]) => Promise<unknown>
  >;
  const toEvent = (entryId: string, payload: string): LogEvent => ({
    id: idOf(entryId),
    ...(JSON.parse(payload) as Payload),
  });

  return {
    async create(tenant, after) {
      try {
        await redis.xgroup('CREATE', logKeys(prefix, tenant).log, group, `${after}-0`, 'MKSTREAM');
      } catch (err) {
        if (!String((err as Error).message).startsWith('BUSYGROUP')) throw err;
      }
    },

    async read(tenant, consumer, count): Promise<GroupRead> {
      const keys = logKeys(prefix, tenant);
      const out = (await scripts.svcGroupRead(keys.log, keys.trim, group, consumer, count)) as string[];
      if (out[0] === 'missing') return { status: 'missing' };
      if (out[0] === 'behind') return { status: 'behind', after: Number(out[1]), below: Number(out[2]) };
      const events: LogEvent[] = [];
      for (let i = 1; i < out.length; i += 2) events.push(toEvent(out[i] as string, out[i + 1] as string));
      return { status: 'read', events };
    },

    async ack(tenant, ids) {
      if (ids.length === 0) return;
      await redis.xack(logKeys(prefix, tenant).log, group, ...ids.map((id) => `${id}-0`));
    },

    async claim(tenant, consumer, minIdleMs, count) {
      const key = logKeys(prefix, tenant).log;
      let reply: [string, [string, string[]][], string[]];
      try {
        reply = (await redis.xautoclaim(key, group, consumer, minIdleMs, '0-0', 'COUNT', count)) as typeof reply;
      } catch (err) {
        // No stream or no group: nothing is pending.
        if (/NOGROUP|no such key/i.test(String((err as Error).message))) return { events: [], gone: [] };
        throw err;
      }
      const [, entries, deleted] = reply;
      await scripts.svcGroupPrune(key, group, minIdleMs);
      return {
        events: entries.map(([entryId, fields]) => toEvent(entryId, fields[1] as string)),
        gone: (deleted ?? []).map(idOf),
      };
    },

    async advance(tenant, from, to) {
      return (await scripts.svcGroupAdvance(logKeys(prefix, tenant).log, group, from, to)) === 1;
    },

    async holdFrom(tenant) {
      const hold = (await scripts.svcGroupHold(logKeys(prefix, tenant).log, group)) as string | null;
      return hold === null ? undefined : Number(hold);
    },

    async drop(tenant) {
      try {
        await redis.xgroup('DESTROY', logKeys(prefix, tenant).log, group);
      } catch (err) {
        // No stream (XGROUP wants the key to exist): no group either.
        if (!/requires the key to exist|no such key|NOGROUP/i.test(String((err as Error).message))) throw err;
      }
    },
  };
}
