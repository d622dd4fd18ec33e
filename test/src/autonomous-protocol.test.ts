// The runner protocol's seam for autonomous turns, below the end-to-end test
// (autonomous-turns): which runner events open one, whatever bytes a runner sends, a
// turn.start with and without the optional idle time, and what the service records for the
// turn ids a runner names.
import { newId, opensAutonomousTurn, RunnerCommandBody, RunnerEvent } from '@svc/core';
import { conversations } from '@svc/db';
import fc from 'fast-check';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { AUTONOMOUS_TURN_PROMPT, openAutonomousTurn } from '../../gateway/src/services/turns.ts';
import { backends, signUp, startTestService } from './harness.ts';

const start = {
  conversation_id: 'cnv_1',
  turn_id: 'trn_1',
  kind: 'stage',
  stream: 'stage',
  stage: 'turn',
  state: 'started',
  data: '{"origin":"autonomous"}',
} as const;

t.test('only a turn start marked autonomous, with its turn id, opens an autonomous turn', async (t) => {
  t.ok(opensAutonomousTurn(start));
  t.notOk(opensAutonomousTurn({ ...start, data: null }), "a user turn's start");
  t.notOk(opensAutonomousTurn({ ...start, data: '{"origin":"user"}' }));
  t.notOk(opensAutonomousTurn({ ...start, state: 'done' }), "the turn's end");
  t.notOk(opensAutonomousTurn({ ...start, stage: 'session' }));
  t.notOk(opensAutonomousTurn({ ...start, kind: 'output' }), 'output, not a stage');
  t.notOk(opensAutonomousTurn({ ...start, turn_id: null }), 'no turn id: nothing to record');
  t.notOk(opensAutonomousTurn({ ...start, data: 'null' }));
  t.notOk(opensAutonomousTurn({ ...start, data: '{"origin":' }), 'data that is not JSON');
});

t.test('whatever data a runner sends, the check answers without throwing', async (t) => {
  fc.assert(
    fc.property(fc.oneof(fc.string(), fc.json()), (data) => {
      const parsed = RunnerEvent.safeParse({ ...start, data });
      if (!parsed.success) return true;
      const opens = opensAutonomousTurn(parsed.data);
      return typeof opens === 'boolean';
    }),
  );
  t.pass();
});

t.test('turn.start takes autonomous_idle_ms as an optional field', async (t) => {
  const command = {
    kind: 'turn.start',
    sandbox: 'sbx_1',
    incarnation: 0,
    conversation_id: 'cnv_1',
    turn_id: 'trn_1',
    prompt: 'hi',
    runtime: { command: 'agent', args: [], env: {} },
    time_limit_ms: 60_000,
  };
  t.ok(RunnerCommandBody.safeParse(command).success, 'without it: a service one release older');
  t.match(RunnerCommandBody.parse({ ...command, autonomous_idle_ms: 2000 }), { autonomous_idle_ms: 2000 });
  t.notOk(RunnerCommandBody.safeParse({ ...command, autonomous_idle_ms: 10 }).success, 'under 100 ms is refused');
});

for (const backend of backends()) {
  t.test(
    `the service records a runner's autonomous turn once, and only under a fresh turn id (${backend})`,
    async (t) => {
      const svc = await startTestService(t, { backend });
      const { sql } = svc.db;
      const me = await signUp(svc);
      const other = await signUp(svc);
      const open = async (accountId: string, title: string) =>
        createConversationRecord(sql, { accountId, actor: 'api', ip: null }, { agentId: 'agt_x', title });
      const mine = await open(me.accountId, 'mine');
      const theirs = await open(other.accountId, 'theirs');

      const turnId = newId('trn');
      t.equal(await openAutonomousTurn({ sql }, me.accountId, mine.id, turnId), true, 'recorded');
      t.match(await conversations.getTurn(sql, me.accountId, turnId), {
        conversation_id: mine.id,
        origin: 'autonomous',
        prompt: AUTONOMOUS_TURN_PROMPT,
        state: 'running',
      });
      t.equal((await conversations.getConversation(sql, me.accountId, mine.id))?.status, 'running');
      t.equal(await openAutonomousTurn({ sql }, me.accountId, mine.id, turnId), false, 'a resend records nothing');

      t.equal(
        await openAutonomousTurn({ sql }, other.accountId, theirs.id, turnId),
        false,
        "another account's turn id is not taken, and nothing fails",
      );
      t.equal((await conversations.getConversation(sql, other.accountId, theirs.id))?.status, 'idle');
      t.equal(await openAutonomousTurn({ sql }, other.accountId, theirs.id, 'not-a-turn-id'), false);
      t.equal(
        await openAutonomousTurn({ sql }, me.accountId, mine.id, newId('trn')),
        false,
        'a second one while a turn runs is not recorded',
      );
    },
  );
}
