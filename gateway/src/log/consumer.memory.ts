import type { ConsumerGroups, GroupRead } from './consumer.ts';
import type { EventLog, LogEvent } from './log.ts';

interface Pending {
  consumer: string;
  /** When it was last handed out (ms): idle since then. */
  at: number;
  event: LogEvent;
}

interface Group {
  position: number;
  /** In id order: entries are added as they are read, and a claim keeps their place. */
  pending: Map<number, Pending>;
}

/**
 * The embedded default: consumer groups kept in this process's memory over any EventLog (the
 * memory log there). Same contract as Redis's groups; every consumer of a group must share
 * this object, as Redis's consumers share the server. Nothing survives a restart, as nothing
 * of the memory log does.
 */
export function memoryConsumerGroups(log: EventLog, options: { now?: () => number } = {}): ConsumerGroups {
  const now = options.now ?? Date.now;
  const groups = new Map<string, Group>();

  return {
    async create(tenant, after) {
      if (!groups.has(tenant)) groups.set(tenant, { position: after, pending: new Map() });
    },

    async read(tenant, consumer, count): Promise<GroupRead> {
      const group = groups.get(tenant);
      if (!group) return { status: 'missing' };
      const floor = await log.floor(tenant);
      if (floor > group.position + 1) return { status: 'behind', after: group.position, below: floor };
      const events = await log.read(tenant, { after: group.position, limit: count });
      // Another read may have moved the position while this one awaited: hand out only what is new.
      const fresh = events.filter((e) => e.id > group.position);
      const at = now();
      for (const event of fresh) group.pending.set(event.id, { consumer, at, event });
      if (fresh.length > 0) group.position = (fresh.at(-1) as LogEvent).id;
      return { status: 'read', events: fresh };
    },

    async ack(tenant, ids) {
      const group = groups.get(tenant);
      for (const id of ids) group?.pending.delete(id);
    },

    async claim(tenant, consumer, minIdleMs, count) {
      const group = groups.get(tenant);
      const events: LogEvent[] = [];
      const gone: number[] = [];
      if (!group) return { events, gone };
      const floor = await log.floor(tenant);
      const at = now();
      for (const [id, p] of group.pending) {
        if (events.length + gone.length >= count) break;
        if (at - p.at < minIdleMs) continue;
        if (id < floor) {
          group.pending.delete(id);
          gone.push(id);
        } else {
          group.pending.set(id, { consumer, at, event: p.event });
          events.push(p.event);
        }
      }
      return { events, gone };
    },

    async advance(tenant, from, to) {
      const group = groups.get(tenant);
      if (!group || group.position !== from) return false;
      group.position = to;
      return true;
    },

    async holdFrom(tenant) {
      const group = groups.get(tenant);
      if (!group) return undefined;
      const [oldest] = group.pending.keys();
      return Math.min(group.position + 1, oldest ?? Number.POSITIVE_INFINITY);
    },

    async drop(tenant) {
      groups.delete(tenant);
    },
  };
}
