import {
  blocksOf,
  PERMISSION_REQUEST_ID,
  PermissionRequestDone,
  PermissionRequestStarted,
  type RunnerEvent,
} from '@svc/core';
import fc from 'fast-check';
import { ConversationPermissions, denyAnswer, offeredOptions, policyAsks } from 'svc-runner';
import t from 'tap';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A `session/request_permission` as the scripted agent (and claude-agent-acp) sends it. */
const request = (
  toolCall: Record<string, unknown> = { toolCallId: 'call_2', title: 'write notes.md', kind: 'edit' },
) => ({
  sessionId: 'sess_1',
  toolCall,
  options: [
    { optionId: 'allow', name: 'Allow once', kind: 'allow_once' },
    { optionId: 'always', name: 'Always', kind: 'allow_always' },
    { optionId: 'never', name: 'Never', kind: 'reject_always' },
    { optionId: 'reject', name: 'Reject', kind: 'reject_once' },
  ],
});

type Emitted = Omit<RunnerEvent, 'conversation_id' | 'turn_id'>;
function gate() {
  const events: Emitted[] = [];
  const p = new ConversationPermissions((e) => events.push(e));
  const stages = () =>
    events.filter((e) => e.stage === 'request').map((e) => ({ state: e.state, data: JSON.parse(e.data ?? 'null') }));
  return { p, events, stages };
}

t.test('the policy asks by tool kind or exact tool name; default ask asks about everything', async (t) => {
  const policy = { default: 'auto_allow' as const, ask: ['edit', 'Bash'] };
  t.equal(policyAsks(policy, request()), true, 'kind edit is listed');
  t.equal(policyAsks(policy, request({ kind: 'execute', title: 'run ls' })), false, 'kind execute is not');
  t.equal(
    policyAsks(policy, request({ kind: 'execute', title: 'ls', _meta: { claudeCode: { toolName: 'Bash' } } })),
    true,
    "Claude Code's tool name",
  );
  t.equal(policyAsks(policy, request({ kind: 'execute', title: 'bash' })), false, 'names match exactly');
  t.equal(policyAsks({ default: 'ask', ask: [] }, request({ kind: 'read' })), true);
  t.equal(policyAsks(undefined, request()), false, 'no policy: nothing waits');
  t.equal(policyAsks(policy, 'not an object'), false);
});

t.test('a denial takes reject_once before reject_always, else cancelled', async (t) => {
  const options = offeredOptions(request());
  t.same(denyAnswer(options), { outcome: 'selected', optionId: 'reject' });
  t.same(denyAnswer(options.filter((o) => o.optionId !== 'reject')), { outcome: 'selected', optionId: 'never' });
  t.same(denyAnswer(options.filter((o) => o.kind.startsWith('allow'))), { outcome: 'cancelled' });
});

t.test('a request the policy does not ask about gets the first allow option and is logged', async (t) => {
  const { p, events, stages } = gate();
  p.configure({ default: 'auto_allow', ask: ['execute'] }, 60_000);
  t.same(await p.ask(request()), { outcome: 'selected', optionId: 'allow' });
  const acp = events.find((e) => e.stream === 'acp');
  const [block] = blocksOf({ kind: 'output', stream: 'acp', data: acp?.data ?? null });
  t.match(block, { kind: 'permission_request', request_id: PERMISSION_REQUEST_ID, summary: 'Allow write notes.md?' });
  t.same(stages(), [
    {
      state: 'done',
      data: { request_id: (block as { request_id: string }).request_id, resolution: 'policy', option_id: 'allow' },
    },
  ]);
  t.equal(p.waiting, 0);
});

t.test('a request that waits: started before its acp event, resolved once by the first valid answer', async (t) => {
  const { p, events, stages } = gate();
  p.configure({ default: 'ask', ask: [] }, 60_000);
  const answered = p.ask(request());
  t.same(
    events.map((e) => e.stream),
    ['stage', 'acp'],
    'the service records it before the block can reach anyone',
  );
  const started = PermissionRequestStarted.parse(JSON.parse(events[0]?.data ?? ''));
  t.same(
    started.options.map((o) => o.optionId),
    ['allow', 'always', 'never', 'reject'],
  );
  t.equal(p.waiting, 1);
  t.equal(p.answer(started.request_id, 'maybe'), false, 'an option not offered is refused');
  t.equal(p.answer('prq_unknown00000', 'allow'), false, 'so is an unknown request');
  t.equal(p.waiting, 1, 'and nothing changed');
  t.equal(p.answer(started.request_id, 'always'), true);
  t.equal(p.answer(started.request_id, 'allow'), false, 'a second answer is dropped');
  t.same(await answered, { outcome: 'selected', optionId: 'always' });
  t.same(stages().at(-1), {
    state: 'done',
    data: { request_id: started.request_id, resolution: 'answered', option_id: 'always' },
  });
  t.ok(PermissionRequestDone.safeParse(stages().at(-1)?.data).success, 'the done event has the protocol shape');
});

t.test('unanswered: denied at the timeout, at the turn end, or cancelled by an interrupt', async (t) => {
  // The gate's timer does not hold a process open (the runner's connection does): hold it here.
  const hold = setInterval(() => {}, 1000);
  t.teardown(() => clearInterval(hold));
  const { p, stages } = gate();
  p.configure({ default: 'ask', ask: [] }, 100);
  const timedOut = p.ask(request());
  await sleep(20);
  t.equal(p.waiting, 1, 'still waiting before the timeout');
  t.same(await timedOut, { outcome: 'selected', optionId: 'reject' });
  t.match(stages().at(-1), { state: 'done', data: { resolution: 'timeout', option_id: 'reject' } });

  p.configure({ default: 'ask', ask: [] }, 60_000);
  const atEnd = p.ask(request());
  p.denyAll('turn_end');
  t.same(await atEnd, { outcome: 'selected', optionId: 'reject' });
  t.match(stages().at(-1), { state: 'done', data: { resolution: 'turn_end', option_id: 'reject' } });

  const interrupted = p.ask(request());
  p.denyAll('interrupted');
  t.same(await interrupted, { outcome: 'cancelled' });
  t.match(stages().at(-1), { state: 'done', data: { resolution: 'interrupted', option_id: null } });
  t.equal(p.waiting, 0);
});

t.test('whatever an agent sends, the options read are well formed and the gate answers', async (t) => {
  await fc.assert(
    fc.asyncProperty(fc.jsonValue(), fc.boolean(), async (value, ask) => {
      const options = offeredOptions(value);
      for (const o of options) {
        if (typeof o.optionId !== 'string' || o.optionId.length === 0) return false;
      }
      const { p, events } = gate();
      p.configure({ default: ask ? 'ask' : 'auto_allow', ask: [] }, 60_000);
      const answer = p.ask(value);
      p.denyAll('turn_end');
      await answer;
      return events.every(
        (e) =>
          e.stage !== 'request' ||
          e.state !== 'started' ||
          PermissionRequestStarted.safeParse(JSON.parse(e.data ?? '')).success,
      );
    }),
    { numRuns: 200 },
  );
  t.pass('no request made the gate throw or report a malformed request');
});
