import { createHook } from 'node:async_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { newId } from '@svc/core';
import { conversations, outbox, type Sql } from '@svc/db';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { changed } from '../../gateway/src/services/tenant-events.ts';
import { TurnWaiters } from '../../gateway/src/services/turn-waiters.ts';
import { turnEndEvent } from '../../gateway/src/services/turns.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { eventually, until } from './until.ts';

/*
 * The process's registry of waits for turns to end (what wait_for_teammate blocks on): waiters
 * cost no database connection and no timer each, and every one wakes, when its turn ends or
 * when its deadline comes.
 */

/** The deadline of the waiters whose turns never end. */
const LASTING_MS = 20_000;

const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;

/**
 * Counts the timers the registry of waiters creates (kept alive or not) while it is enabled:
 * those made inside a TurnWaiters method. Not the process's other timers: the test's own
 * polling and the service's periodic work make more of them the longer the 1000 reads take on
 * a busy machine (20 in one CI run), which says nothing of the waiters.
 */
function timerCreations() {
  const counter = { created: 0 };
  const hook = createHook({
    init(_id, type) {
      if (type === 'Timeout' && new Error().stack?.includes('TurnWaiters.')) counter.created++;
    },
  });
  return { counter, hook };
}

// Each backend starts its services and runners again.

for (const backend of backends()) {
  t.test(`waiting for turns to end on ${backend}`, async (t) => {
    const svc = await startTestService(t, { backend });
    const sql = svc.db.sql;
    const me = await signUp(svc);
    const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
    const waiters = svc.turnWaiters;

    /** A conversation with a running turn; the turn's id. */
    const runningTurn = async () => {
      const conv = await createConversationRecord(sql, who, { agentId: 'agt_x', channelId: 'svc:team' });
      const turn = await conversations.startTurn(sql, {
        id: newId('trn'),
        accountId: me.accountId,
        conversationId: conv.id,
        prompt: 'work',
        origin: 'user',
      });
      if (typeof turn === 'string') throw new Error(turn);
      return turn;
    };
    /** Ends the turn as the service ends one: the record and its `turn` stage event, through the outbox. */
    const endTurn = async (turn: conversations.TurnRow, state: 'done' | 'failed' = 'done') => {
      await conversations.endTurn(sql, me.accountId, turn.id, state, null, [
        turnEndEvent(turn.conversation_id, turn.id, state, 'ended by the test'),
        changed('conversations'),
      ]);
    };

    t.test('1000 waiters hold no database connection and no timer each, and all wake', async (t) => {
      const turns = await Promise.all(Array.from({ length: 100 }, () => runningTurn()));
      const ending = turns.slice(0, 50);
      const lasting = turns.slice(50);
      // The pool's connections are all open first: each holds timers of its own (its lifetime).
      await Promise.all(Array.from({ length: 40 }, () => sql`SELECT 1`));
      const before = timers();
      const creations = timerCreations();
      creations.hook.enable();
      const results = [
        // Ten waiters on each turn: those on the turns that end wait long, the others time out.
        ...ending.flatMap((turn) => Array.from({ length: 10 }, () => waiters.wait(me.accountId, turn.id, 60_000))),
        // Their deadline is well after the last of them registered, even when the 1000 reads
        // take seconds on a busy machine.
        ...lasting.flatMap((turn) => Array.from({ length: 10 }, () => waiters.wait(me.accountId, turn.id, LASTING_MS))),
      ];
      await until(
        'every waiter has read its turn running and waits',
        () => waiters.pending === 1000 || undefined,
        15_000,
      );
      creations.hook.disable();
      const during = timers();
      t.ok(
        creations.counter.created < 20,
        `no timer is made per waiter (${creations.counter.created} made while 1000 registered)`,
      );
      t.ok(during - before <= 2, `active timers do not grow with the waiters (${before} before, ${during} with 1000)`);
      if (svc.backend === 'postgres+redis') {
        // The service's own periodic work (sweeps, the outbox relay) may catch a connection
        // busy for a moment; a waiter that held one would hold it for its whole wait. So a
        // connection must stay busy across a second of samples to count.
        let busy: { query: string; state: string }[] = [];
        for (let i = 0; i < 6; i++) {
          if (i > 0) await sleep(200);
          busy = await sql<{ query: string; state: string }[]>`
            SELECT query, state FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`;
          if (busy.length === 0) break;
        }
        t.same(busy, [], 'no database connection is busy or in a transaction for them');
      }
      t.equal((await sql<{ one: number }[]>`SELECT 1 AS one`)[0]?.one, 1, 'the database answers while they wait');

      for (const turn of ending) await endTurn(turn);
      await svc.relay.flush(me.accountId);
      const settled = await Promise.all(results);
      const woken = settled.slice(0, 500);
      const timedOut = settled.slice(500);
      t.ok(
        woken.every((r) => !r.timedOut && r.turn?.state === 'done'),
        'the 500 waiters of the turns that ended wake with the ended record',
      );
      t.ok(
        timedOut.every((r) => r.timedOut && r.turn?.state === 'running'),
        'the 500 others wake at their deadline, their turn still running',
      );
      t.equal(waiters.pending, 0, 'nothing is left registered');
      // A pool connection may be between states at any one moment (the embedded pool closes
      // idle ones and opens them again, a connect timer running meanwhile), so the count is
      // given a few seconds to settle; a timer the waiters left behind would not go.
      const settledTimers = await eventually(() => timers() <= before, 15_000).then(() => timers());
      t.ok(settledTimers <= before, `and the timer is gone with them (${before} before, ${settledTimers} after)`);
    });

    t.test('a turn that ended before the wait answers at once', async (t) => {
      const turn = await runningTurn();
      await endTurn(turn, 'failed');
      const r = await waiters.wait(me.accountId, turn.id, 60_000);
      t.match(r, { timedOut: false, turn: { id: turn.id, state: 'failed' } });
    });

    t.test('an end the log carries before the record says so wakes the waiter once the record ends', async (t) => {
      const turn = await runningTurn();
      // A registry of its own, to see when it has read the record after the end event.
      const reads: string[] = [];
      const own = new TurnWaiters({
        log: svc.eventLog,
        readTurn: async (accountId, turnId) => {
          const row = await conversations.getTurn(sql, accountId, turnId);
          reads.push(row?.state ?? 'missing');
          return row;
        },
      });
      t.teardown(() => own.close());
      let woke: Awaited<ReturnType<TurnWaiters['wait']>> | undefined;
      void own.wait(me.accountId, turn.id, 600_000).then((r) => {
        woke = r;
      });
      await until('the waiter has read the record once', () => reads.length === 1 || undefined);
      // As failTurnStart does: the turn's end reaches the log first, then the record ends.
      await sql.begin((tx) =>
        outbox.enqueue(tx as unknown as Sql, me.accountId, [
          turnEndEvent(turn.conversation_id, turn.id, 'failed', 'could not start'),
        ]),
      );
      await svc.relay.flush(me.accountId);
      await until('the end event made it read the record again', () => reads.length === 2 || undefined);
      t.same(reads, ['running', 'running'], 'the record still said running then');
      // The record ends with only the change event beside it: no second turn end to wake on.
      await conversations.endTurn(sql, me.accountId, turn.id, 'failed', null, [changed('conversations')]);
      await svc.relay.flush(me.accountId);
      t.match(await until('the waiter wakes (long before its deadline)', () => woke), {
        timedOut: false,
        turn: { id: turn.id, state: 'failed' },
      });
    });
  });
}
