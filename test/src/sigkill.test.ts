/**
 * A node killed with SIGKILL during a burst of appends (DESIGN.md "The event log", invariants
 * 1, 3, 4 and 5): every acknowledged event is readable afterwards, through the JSON feed, a
 * stream replay and the Postgres copy, none twice; the producer's resend after the kill is a
 * no-op, and ids never go back.
 *
 * Redis and Postgres only. The in-memory backend is left out on purpose: its log dies with the
 * process, so there only events acknowledged *durable* (copied to Postgres) could survive, and
 * the embedded database serves the one process that holds DATA_DIR and stops with it; there is
 * nothing for a second node to share.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { logEvents } from '@svc/db';
import { Redis } from 'ioredis';
import postgres from 'postgres';
import t from 'tap';
import { logKeys } from '../../gateway/src/log/log.redis.ts';
import type { AppendResult } from '../../gateway/src/log/log.ts';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { signUp, startTestService } from './harness.ts';
import { frames, parseFrame, rawGet } from './sse-client.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');

/** Acknowledged appends (batches) to wait for before the kill. */
const ACKS_BEFORE_KILL = 300;
/** Events the producer sends after the last one it saw acknowledged, through the new node. */
const RESUMED_EVENTS = 120;
/** Small, so the copier trims the hot tail and reads cross from Postgres into Redis. */
const HOT_EVENTS = '200';

interface Ack {
  from: number;
  to: number;
  status: string;
  ids: number[];
  hwm: number;
}

/** The events of the complete SSE frames so far (a frame still arriving is left out), checked against their id lines. */
function sseEvents(raw: string): { id: number; data: string }[] {
  return frames(raw)
    .map(parseFrame)
    .filter((e) => e.data !== undefined)
    .map((e) => {
      const payload = JSON.parse(e.data as string) as { id: number; data: string };
      if (e.event !== undefined || payload.id !== Number(e.id))
        throw new Error(`not an event frame: ${JSON.stringify(e)}`);
      return { id: payload.id, data: payload.data };
    });
}

const increasing = (ids: number[]) => ids.every((id, i) => i === 0 || id > (ids[i - 1] as number));
const seqOf = (data: string) => Number(/^event (\d+)$/.exec(data)?.[1]);

t.test(
  'a node killed with SIGKILL during a burst of appends',
  {
    skip:
      !(process.env.TEST_REDIS_URL && process.env.TEST_DATABASE_URL) &&
      'needs TEST_REDIS_URL and TEST_DATABASE_URL (run through npm test)',
  },
  async (t) => {
    // Node A sets up the account and conversation, then goes away: during the burst the child
    // is the only node, so its copier is the only one and the kill interrupts it too.
    const a = await startTestService(t, { backend: 'postgres+redis' });
    const me = await signUp(a);
    const conv = await createConversationRecord(
      a.db.sql,
      { accountId: me.accountId, actor: 'api', ip: null },
      { agentId: 'agt_x' },
    );
    const tenant = me.accountId;
    const shared = {
      DATABASE_URL: a.config.DATABASE_URL as string,
      REDIS_URL: a.config.REDIS_URL as string,
      REDIS_KEY_PREFIX: a.config.REDIS_KEY_PREFIX,
      MASTER_KEY: a.config.MASTER_KEY as string,
      LOG_COPY_INTERVAL_MS: '20',
      LOG_HOT_EVENTS: HOT_EVENTS,
    };
    await a.close();

    // The burst, in a child process.
    const acks: Ack[] = [];
    let partial = '';
    let stderr = '';
    let killedAt: number | undefined;
    let readyAt = 0;
    let killTime = 0;
    const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', join(here, 'fixtures', 'burst-node.ts')], {
      cwd: root,
      env: {
        PATH: process.env.PATH,
        NODE_ENV: 'test',
        ...shared,
        PORT: '0',
        HOST: '127.0.0.1',
        DATA_DIR: a.dataDir,
        MAIL_DIR: a.mailDir,
        LOG_LEVEL: 'silent',
        RATE_LIMIT_PER_MINUTE: '0',
        BURST_TENANT: tenant,
        BURST_CONVERSATION: conv.id,
        BURST_PRODUCER: 'burst',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    t.teardown(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
    const closed = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      child.on('close', (code, signal) => resolve({ code, signal })),
    );
    child.stderr?.on('data', (d) => {
      stderr += d.toString();
    });
    child.stdout?.on('data', (d) => {
      partial += d.toString();
      const lines = partial.split('\n');
      partial = lines.pop() as string; // a line cut by the kill is no acknowledgement
      for (const line of lines) {
        if (!line.startsWith('{')) continue;
        const msg = JSON.parse(line) as Ack | { ready: true };
        if ('ready' in msg) {
          readyAt = Date.now();
          continue;
        }
        acks.push(msg);
        if (acks.length >= ACKS_BEFORE_KILL && killedAt === undefined) {
          killedAt = acks.length;
          killTime = Date.now();
          child.kill('SIGKILL');
        }
      }
    });
    const timeout = setTimeout(() => child.kill('SIGKILL'), 20_000);
    const exit = await closed;
    clearTimeout(timeout);
    t.equal(exit.signal, 'SIGKILL', `the child died of SIGKILL mid-burst ${stderr ? `(stderr: ${stderr})` : ''}`);
    t.ok(killedAt !== undefined && acks.length >= ACKS_BEFORE_KILL, `${acks.length} appends acknowledged`);
    if (acks.length < ACKS_BEFORE_KILL) return;
    t.ok(
      acks.every((x, i) => x.status === 'appended' && x.from === (i === 0 ? 1 : (acks[i - 1] as Ack).to + 1)),
      'acknowledgements cover consecutive seqs from 1',
    );
    const ackedIds = new Map<number, number>(); // seq -> the id its acknowledgement named
    for (const x of acks) for (const [i, id] of x.ids.entries()) ackedIds.set(x.from + i, id);
    const lastAcked = (acks.at(-1) as Ack).to;

    // What Redis took from the child beyond its last acknowledgement (appends in flight).
    const redis = new Redis(shared.REDIS_URL);
    t.teardown(() => redis.quit());
    const keys = logKeys(shared.REDIS_KEY_PREFIX, tenant);
    const markAfterKill = Number(await redis.get(keys.producer('burst')));
    t.ok(markAfterKill >= lastAcked, `the producer's mark survived the kill (${markAfterKill})`);
    const lastIdAfterKill = Number(await redis.get(keys.seq));
    const pg = postgres(shared.DATABASE_URL, { max: 1, onnotice: () => {} });
    const copiedByDead = await logEvents.copiedUpTo(pg, tenant);
    const rowsByDead = (
      await pg<{ n: number }[]>`SELECT count(*)::int AS n FROM log_events WHERE account_id = ${tenant}`
    )[0]?.n;
    await pg.end();
    t.comment(
      `in ${killTime - readyAt} ms the dead node had ${acks.length} batches acknowledged (seq 1-${lastAcked}), ` +
        `Redis took ${markAfterKill - lastAcked} more unacknowledged, its copier had stored ${rowsByDead} events, up to id ${copiedByDead}`,
    );

    // A fresh node on the same Redis and Postgres.
    const b = await startTestService(t, {
      backend: 'postgres+redis',
      env: { ...shared, SSE_IDLE_CLOSE_MS: '0' },
    });
    const auth = { authorization: `Bearer ${me.key}` };

    // A watcher that joins from the start while the new node's copier catches up and the
    // producer resumes: history and live must join without a gap or a repeat.
    const watcher = rawGet(b, `/api/conversations/${conv.id}/stream?wait=true`, { ...auth, 'last-event-id': '0' });
    t.teardown(() => watcher.sock.destroy());

    // The producer resumes: it resends its last acknowledged batches (it cannot know the node
    // died after they were taken), then goes on from the last one it saw acknowledged.
    const resend = acks.slice(-3);
    const range = (from: number, to: number) =>
      Array.from({ length: to - from + 1 }, (_, i) => ({
        conversationId: conv.id,
        kind: 'output',
        stream: 'stdout',
        data: `event ${from + i}`,
      }));
    const resent: AppendResult[] = [];
    for (const x of resend) {
      resent.push(await b.appendEvents({ tenant, producer: 'burst', seq: x.from, events: range(x.from, x.to) }));
    }
    t.same(
      resent.map((r) => r.status),
      resend.map(() => 'duplicate'),
      'the resend of acknowledged batches is a duplicate, each',
    );
    t.ok(
      resent.every((r) => r.events.length === 0 && r.hwm >= lastAcked),
      'and names a mark at or past them',
    );
    const final = lastAcked + RESUMED_EVENTS;
    const statuses: string[] = [];
    for (let from = lastAcked + 1; from <= final; ) {
      const to = Math.min(final, from + (from % 10));
      const r = await b.appendEvents({ tenant, producer: 'burst', seq: from, events: range(from, to) });
      statuses.push(r.status);
      for (const e of r.events) ackedIds.set(seqOf(e.data as string), e.id);
      from = to + 1;
    }
    t.notOk(statuses.includes('gap'), `the resumed appends are taken (${statuses.length} batches, no gap)`);
    // Seqs the dead node's Redis took without an acknowledgement reaching the producer come
    // back as duplicates; every other seq has an acknowledged id, from the child or the new node.
    const unacked = Array.from({ length: markAfterKill - lastAcked }, (_, i) => lastAcked + 1 + i);
    t.same(
      Array.from({ length: final }, (_, i) => i + 1).filter((seq) => !ackedIds.has(seq)),
      unacked,
      'every seq was acknowledged with an id, but those taken by Redis unacknowledged before the kill',
    );
    const newIds = [...ackedIds.entries()].filter(([seq]) => seq > markAfterKill).map(([, id]) => id);
    t.ok(
      newIds.length > 0 && newIds.every((id) => id > lastIdAfterKill),
      "the new node's ids are above every id the dead node's appends took",
    );
    const expected = Array.from({ length: final }, (_, i) => `event ${i + 1}`);

    // Let the new node's copier take everything into Postgres (it resumes from the mark the
    // killed node's copier left).
    const lastId = Math.max(...ackedIds.values());
    for (let i = 0; i < 200 && (await logEvents.copiedUpTo(b.db.sql, tenant)) < lastId; i++) await sleep(25);
    t.equal(await logEvents.copiedUpTo(b.db.sql, tenant), lastId, 'the copier caught up');
    t.ok(
      (await redis.xlen(keys.log)) < final,
      `the hot tail was trimmed (${await redis.xlen(keys.log)} of ${final} in Redis), so reads cross into Postgres`,
    );

    t.test('the JSON feed, paged, has every event once, in seq and id order, under its acknowledged id', async (t) => {
      const feed: { id: number; data: string }[] = [];
      const statuses = new Set<number>();
      let after = 0;
      for (let pages = 0; pages < 100; pages++) {
        const page = await b.http.get(`/api/conversations/${conv.id}/events?limit=137&after=${after}`, {
          token: me.key,
        });
        statuses.add(page.status);
        if (page.status !== 200) break;
        feed.push(...page.body.data.map((e: { id: number; data: string }) => ({ id: e.id, data: e.data })));
        if (!page.body.meta.has_more) break;
        after = page.body.meta.next_cursor;
      }
      t.same([...statuses], [200], 'every page answered 200');
      t.same(
        feed.map((e) => e.data),
        expected,
        `events 1-${final}, each once`,
      );
      t.ok(increasing(feed.map((e) => e.id)), 'ids strictly increasing');
      const wrong = feed.filter((e) => ackedIds.has(seqOf(e.data)) && ackedIds.get(seqOf(e.data)) !== e.id);
      t.same(wrong, [], 'each acknowledged event carries the id its acknowledgement named');
    });

    t.test('a stream replay from Last-Event-ID 0 sees every event once, in order', async (t) => {
      const replay = rawGet(b, `/api/conversations/${conv.id}/stream`, { ...auth, 'last-event-id': '0' });
      await replay.closed; // wait=false on an idle conversation: the history, then the end
      const events = sseEvents(replay.text());
      t.same(
        events.map((e) => e.data),
        expected,
      );
      t.ok(increasing(events.map((e) => e.id)), 'ids strictly increasing');
      t.same(
        events.filter((e) => ackedIds.has(seqOf(e.data)) && ackedIds.get(seqOf(e.data)) !== e.id),
        [],
        'under the acknowledged ids',
      );
    });

    t.test('the watcher that joined during the catch-up and the resend saw every event once, in order', async (t) => {
      for (let i = 0; i < 100 && sseEvents(watcher.text()).length < final; i++) await sleep(50);
      await sleep(100); // anything doubled would arrive now
      const events = sseEvents(watcher.text());
      t.same(
        events.map((e) => e.data),
        expected,
      );
      t.ok(increasing(events.map((e) => e.id)), 'ids strictly increasing');
    });

    t.test('Postgres holds every event once', async (t) => {
      const rows = await b.db.sql<{ id: string; data: string }[]>`
        SELECT id::text, data FROM log_events WHERE account_id = ${tenant} AND conversation_id = ${conv.id} ORDER BY id`;
      t.same(
        rows.map((r) => r.data),
        expected,
        'no payload missing or doubled',
      );
      t.same(
        rows.filter((r) => ackedIds.has(seqOf(r.data)) && ackedIds.get(seqOf(r.data)) !== Number(r.id)),
        [],
        'under the acknowledged ids',
      );
    });
  },
);
