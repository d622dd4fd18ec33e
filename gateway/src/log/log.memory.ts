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
  sharedMarkLoads,
  storedFields,
  TRIM_SLACK,
  type TrimOptions,
  trimLimit,
} from './log.ts';

/**
 * The embedded default: the whole log in this process's memory. Same contract as the Redis
 * adapter; nothing survives a restart (the durable copy in Postgres does, and a producer's
 * mark comes back from it through `loadMark`).
 */
export function memoryEventLog(options: { now?: () => number; loadMark?: LoadMark } = {}): EventLog {
  const now = options.now ?? clockMicros;
  const loadMark = options.loadMark && sharedMarkLoads(options.loadMark);
  const tenants = new Map<
    string,
    { last: number; floor: number; events: LogEvent[]; subscribers: Set<(b: LiveBatch) => void> }
  >();
  const marks = new Map<string, number>(); // `${tenant}\0${producer}` -> high-water mark
  // The last id of each dropped tenant: ids run ahead of the clock in a burst (and the clock may
  // count whole milliseconds), so an append just after a drop could otherwise reuse a forgotten
  // id. One number per deleted account.
  const dropped = new Map<string, number>();

  const tenantOf = (tenant: string) => {
    let t = tenants.get(tenant);
    if (!t) {
      t = { last: 0, floor: 0, events: [], subscribers: new Set() };
      tenants.set(tenant, t);
    }
    return t;
  };

  return {
    async append(input: AppendInput): Promise<AppendResult> {
      const markKey = `${input.tenant}\0${input.producer}`;
      const seqs = seqsOf(input);
      const first = seqs[0] ?? input.seq;
      const end = seqs.at(-1) ?? input.seq - 1;
      if (!marks.has(markKey) && loadMark) {
        const loaded = await loadMark(input.tenant, input.producer);
        // Another append may have set it meanwhile; it is at least as new as the durable one.
        if (loaded !== undefined && !marks.has(markKey)) marks.set(markKey, loaded);
      }
      const hwm = marks.get(markKey) ?? first - 1;
      if (end <= hwm) return { status: 'duplicate', events: [], hwm };
      if (first > hwm + 1) return { status: 'gap', events: [], hwm };
      const t = tenantOf(input.tenant);
      const prev = t.last;
      const ts = new Date().toISOString();
      const floor = Math.max(now(), (dropped.get(input.tenant) ?? 0) + 1);
      const appended: LogEvent[] = [];
      input.events.forEach((e, i) => {
        const seq = seqs[i] as number;
        if (seq <= hwm) return;
        t.last = Math.max(t.last + 1, floor);
        appended.push({ id: t.last, ...storedFields(e, ts, input.producer, seq) });
      });
      t.events.push(...appended);
      marks.set(markKey, end);
      const batch: LiveBatch = { tenant: input.tenant, prev, events: appended };
      for (const s of t.subscribers) queueMicrotask(() => s(batch));
      return { status: 'appended', events: appended, hwm: end };
    },

    async read(tenant: string, o: ReadOptions): Promise<LogEvent[]> {
      const events = tenants.get(tenant)?.events ?? [];
      // Ids are increasing: binary search for the first after `o.after`.
      let lo = 0;
      let hi = events.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if ((events[mid] as LogEvent).id <= o.after) lo = mid + 1;
        else hi = mid;
      }
      const out: LogEvent[] = [];
      for (let i = lo; i < events.length && out.length < o.limit; i++) {
        const e = events[i] as LogEvent;
        if (!o.conversationId || e.conversationId === o.conversationId) out.push(e);
      }
      return out;
    },

    async lastId(tenant: string) {
      return tenants.get(tenant)?.last ?? 0;
    },

    async subscribe(tenant: string, onBatch: (b: LiveBatch) => void) {
      const t = tenantOf(tenant);
      t.subscribers.add(onBatch);
      return () => {
        t.subscribers.delete(onBatch);
      };
    },

    async trim(tenant: string, o: TrimOptions) {
      const t = tenants.get(tenant);
      // As on Redis: nothing to do until the tail has grown a TRIM_SLACK-th past `keep`.
      const excess = (t?.events.length ?? 0) - o.keep;
      if (!t || excess <= 0 || excess <= Math.floor(o.keep / TRIM_SLACK)) return;
      const events = t.events;
      const limit = await trimLimit(o, events.length, async (index) => (events[index] as LogEvent).id);
      const cut = Math.min((events[excess] as LogEvent).id, limit);
      if ((events[0] as LogEvent).id >= cut) return;
      t.floor = Math.max(t.floor, cut);
      t.events = events.filter((e) => e.id >= cut);
    },

    async floor(tenant: string) {
      return tenants.get(tenant)?.floor ?? 0;
    },

    async dropTenant(tenant: string) {
      const last = tenants.get(tenant)?.last ?? 0;
      if (last > (dropped.get(tenant) ?? 0)) dropped.set(tenant, last);
      tenants.delete(tenant);
      for (const key of marks.keys()) if (key.startsWith(`${tenant}\0`)) marks.delete(key);
    },

    async close() {
      tenants.clear();
    },
  };
}
