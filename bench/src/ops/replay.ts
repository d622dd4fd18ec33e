import { logEvents } from '@svc/db';
import { logKeys } from '../../../gateway/src/log/log.redis.ts';
import type { Service } from '../../../gateway/src/main.ts';
import { createConversationRecord } from '../../../gateway/src/services/conversations.ts';
import { signUp } from '../tenant.ts';

export interface ReplayFixture {
  key: string;
  accountId: string;
  conversationId: string;
  /** The Last-Event-ID a reconnecting watcher sends: the tenant's last id before the range. */
  after: number;
  /** The last id of the range (an event of the conversation). */
  last: number;
  /** Events appended in the range (all of the conversation). */
  events: number;
  /** Events of the tenant in (after, last] (the outbox may add a tenant event or two). */
  tenantEvents: number;
  /** Where Redis's tenant log starts (the trim point): below it, events are in Postgres only. */
  floor: number;
  /** The copy mark: everything up to it is in Postgres. */
  copiedUpTo: number;
  /** Events of the range still in Redis's tenant log (ids >= floor). */
  hotEvents: number;
  /** Redis keys the raw XRANGE baseline reads. */
  tenantLogKey: string;
  conversationKey: string;
  copyMs: number;
  appendMs: number;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Inside the target: a tenant with one conversation and `events` output events appended
 * through the write path (`svc.appendEvents`, batches of `batch`), then waits until the copier
 * has made all of them durable in Postgres and trimmed Redis's tenant log to the newest
 * LOG_HOT_EVENTS. The older part of the range is then in Postgres only, the newest part in
 * both (the hot tail).
 */
export async function prepare(svc: Service, args: { events: number; batch?: number }): Promise<ReplayFixture> {
  const batch = args.batch ?? 100;
  const me = await signUp(svc);
  const tenant = me.accountId;
  const conv = await createConversationRecord(
    svc.db.sql,
    { accountId: tenant, actor: 'api', ip: null },
    { agentId: 'agt_bench', title: 'replay bench' },
  );
  if (!conv) throw new Error('conversation not created');
  // The creation's `conversations` event goes through the outbox relay; let it land first.
  for (let i = 0; i < 100 && (await svc.eventLog.lastId(tenant)) === 0; i++) await sleep(20);
  await sleep(300);
  const after = await svc.eventLog.lastId(tenant);
  const line = 'replay bench output: a line of typical length for a build log, with some padding';
  const appendStarted = performance.now();
  let seq = 1;
  let last = 0;
  for (let done = 0; done < args.events; ) {
    const n = Math.min(batch, args.events - done);
    const events = Array.from({ length: n }, (_, k) => ({
      conversationId: conv.id,
      kind: 'output',
      stream: 'stdout',
      data: `${line} ${done + k}\n`,
    }));
    const r = await svc.appendEvents({ tenant, producer: 'bench-replay', seq, events });
    if (r.status !== 'appended') throw new Error(`append ${r.status} at seq ${seq}`);
    last = (r.events.at(-1) as { id: number }).id;
    seq += n;
    done += n;
  }
  const appendMs = performance.now() - appendStarted;
  const copyStarted = performance.now();
  // The copier runs on its timer; passes here only hurry it. Done when the mark reaches the end
  // and the hot tail has been trimmed (the trim follows the copy in the same pass).
  for (;;) {
    await svc.copier.pass();
    const mark = await logEvents.copiedUpTo(svc.db.sql, tenant);
    if (mark >= last && (await svc.eventLog.floor(tenant)) > after + 1) break;
    if (performance.now() - copyStarted > 300_000) throw new Error(`copy not durable after 300 s (mark ${mark})`);
    await sleep(50);
  }
  const copyMs = performance.now() - copyStarted;
  const floor = await svc.eventLog.floor(tenant);
  const copiedUpTo = await logEvents.copiedUpTo(svc.db.sql, tenant);
  const [{ n: tenantEvents }] = (await svc.db.sql`
    SELECT count(*)::int AS n FROM log_events WHERE account_id = ${tenant} AND id > ${after} AND id <= ${last}`) as unknown as [
    { n: number },
  ];
  const [{ n: hotEvents }] = (await svc.db.sql`
    SELECT count(*)::int AS n FROM log_events WHERE account_id = ${tenant} AND id >= ${floor} AND id <= ${last}`) as unknown as [
    { n: number },
  ];
  const keys = logKeys(svc.config.REDIS_KEY_PREFIX, tenant);
  return {
    key: me.key,
    accountId: tenant,
    conversationId: conv.id,
    after,
    last,
    events: args.events,
    tenantEvents,
    floor,
    copiedUpTo,
    hotEvents,
    tenantLogKey: keys.log,
    conversationKey: keys.conversation(conv.id),
    copyMs,
    appendMs,
  };
}

/**
 * What autovacuum does within a minute of a bulk load. Before it the planner has no statistics
 * for the new rows and reads a tenant's page as a bitmap scan of the whole rest of the range
 * plus a sort, on every page.
 */
export async function analyze(svc: Service): Promise<void> {
  await svc.db.sql`ANALYZE log_events`;
}
