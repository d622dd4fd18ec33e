// The runner protocol's seam for autonomous turns, below the end-to-end test
// (autonomous-turns): which runner events open one, whatever bytes a runner sends, and a
// turn.start with and without the optional idle time.
import { opensAutonomousTurn, RunnerCommandBody, RunnerEvent } from '@svc/core';
import fc from 'fast-check';
import t from 'tap';

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
