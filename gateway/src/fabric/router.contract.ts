import { ApiError, type RunnerCommandBody } from '@svc/core';
import type { Test } from 'tap';
import type { RouterNodeOptions, RunnerRouter, RunnerSelector } from './router.ts';

/** Builds one node's router; nodes from one cluster share a store, ready to route on return. */
export type RouterNodeFactory = (o: RouterNodeOptions) => Promise<RunnerRouter>;

/** A node under test: its router, and what reached its `run`, `onDurable` and `onDisconnect`. */
interface TestNode {
  router: RunnerRouter;
  ran: { runnerId: string; body: RunnerCommandBody }[];
  marks: Map<string, number>[];
  disconnected: { who: RunnerSelector; code: number; reason: string }[];
  /** How this node's `run` answers the next commands (default: acknowledged at once). */
  answer: (runnerId: string) => Promise<void>;
}

const until = async (what: string, ok: () => boolean) => {
  const deadline = Date.now() + 5000;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * What every RunnerRouter adapter must do (CONVENTIONS 1; the guarantees are on the port in
 * router.ts). `cluster` gives a factory for nodes that share one fresh store, so runner ids
 * of one test never meet another's.
 */
export function runnerRouterContract(t: Test, cluster: () => Promise<RouterNodeFactory> | RouterNodeFactory) {
  const interrupt = (sandbox: string): RunnerCommandBody => ({
    kind: 'turn.interrupt',
    sandbox,
    conversation_id: 'cnv_1',
    turn_id: 'trn_1',
  });

  async function nodes(t: Test, count: number, o: { holdMs?: number; timeoutMs?: number } = {}) {
    const make = await cluster();
    const out: TestNode[] = [];
    for (let i = 0; i < count; i++) {
      const n: TestNode = {
        router: undefined as never,
        ran: [],
        marks: [],
        disconnected: [],
        answer: async () => {},
      };
      n.router = await make({
        holdMs: o.holdMs ?? 30_000,
        timeoutMs: o.timeoutMs ?? 5_000,
        run: (runnerId, body) => {
          n.ran.push({ runnerId, body });
          return n.answer(runnerId);
        },
        onDurable: (marks) => n.marks.push(new Map(marks)),
        onDisconnect: (who, code, reason) => n.disconnected.push({ who, code, reason }),
      });
      t.teardown(() => n.router.close());
      out.push(n);
    }
    return out;
  }

  const code = (err: unknown) => (err instanceof ApiError ? err.code : String(err));

  t.test('a command for a runner another node holds runs there; forward resolves once acknowledged', async (t) => {
    const [a, b] = (await nodes(t, 2)) as [TestNode, TestNode];
    let ack!: () => void;
    a.answer = () => new Promise<void>((resolve) => (ack = resolve));
    a.router.hold('rnr_1');
    let settled = false;
    const sent = b.router.forward('rnr_1', interrupt('sbx_1')).finally(() => (settled = true));
    await until('the holder ran the command', () => a.ran.length === 1);
    t.same(a.ran, [{ runnerId: 'rnr_1', body: interrupt('sbx_1') }], 'the body arrives whole, once');
    t.equal(settled, false, 'not resolved before the runner acknowledged');
    ack();
    await sent;
    t.same(b.ran, [], 'the sender ran nothing itself');
  });

  t.test("the holder's failure comes back: runner_offline as such, anything else internal_error", async (t) => {
    const [a, b] = (await nodes(t, 2)) as [TestNode, TestNode];
    a.router.hold('rnr_gone');
    a.router.hold('rnr_broken');
    a.answer = (runnerId) =>
      Promise.reject(
        runnerId === 'rnr_gone'
          ? new ApiError('runner_offline', 'The runner disconnected before acknowledging the command.')
          : new ApiError('sandbox_not_found', 'no such sandbox'),
      );
    const gone = await b.router.forward('rnr_gone', interrupt('sbx_1')).catch((e: unknown) => e);
    t.equal(code(gone), 'runner_offline');
    t.equal((gone as Error).message, 'The runner disconnected before acknowledging the command.');
    const broken = await b.router.forward('rnr_broken', interrupt('sbx_1')).catch((e: unknown) => e);
    t.equal(code(broken), 'internal_error');
  });

  t.test('a runner no other node holds is runner_offline, also for the node holding it', async (t) => {
    const [a, b] = (await nodes(t, 2)) as [TestNode, TestNode];
    t.equal(code(await b.router.forward('rnr_nobody', interrupt('sbx_1')).catch((e) => e)), 'runner_offline');
    a.router.hold('rnr_mine');
    t.equal(
      code(await a.router.forward('rnr_mine', interrupt('sbx_1')).catch((e) => e)),
      'runner_offline',
      'a node never forwards to itself',
    );
    t.same(a.ran, []);
  });

  t.test("a release drops the node's own claim and leaves a newer holder's", async (t) => {
    const [a, b, c] = (await nodes(t, 3)) as [TestNode, TestNode, TestNode];
    a.router.hold('rnr_1');
    a.router.release('rnr_1');
    t.equal(code(await c.router.forward('rnr_1', interrupt('sbx_1')).catch((e) => e)), 'runner_offline');
    a.router.hold('rnr_1');
    b.router.hold('rnr_1'); // the runner reconnected to b
    a.router.release('rnr_1'); // a's old connection closes late
    await c.router.forward('rnr_1', interrupt('sbx_1'));
    t.equal(b.ran.length, 1, 'the command went to the newer holder');
    t.same(a.ran, []);
  });

  t.test('a claim not renewed within holdMs lapses; renewing keeps it', async (t) => {
    // Renewed every 300 ms for 1.5 s under a 1 s claim: only the claim left alone lapses.
    const [a, b] = (await nodes(t, 2, { holdMs: 1000 })) as [TestNode, TestNode];
    a.router.hold('rnr_lapsing');
    a.router.hold('rnr_renewed');
    for (let i = 0; i < 5; i++) {
      await sleep(300);
      a.router.hold('rnr_renewed');
    }
    t.equal(code(await b.router.forward('rnr_lapsing', interrupt('sbx_1')).catch((e) => e)), 'runner_offline');
    await b.router.forward('rnr_renewed', interrupt('sbx_1'));
    t.same(
      a.ran.map((r) => r.runnerId),
      ['rnr_renewed'],
    );
  });

  t.test('a command not acknowledged within timeoutMs answers runner_offline', async (t) => {
    const [a, b] = (await nodes(t, 2, { timeoutMs: 200 })) as [TestNode, TestNode];
    a.answer = () => new Promise<void>(() => {});
    a.router.hold('rnr_slow');
    t.equal(code(await b.router.forward('rnr_slow', interrupt('sbx_1')).catch((e) => e)), 'runner_offline');
    t.equal(a.ran.length, 1, 'the holder did get it');
  });

  t.test('durable marks reach every other node, not the sender', async (t) => {
    const [a, b, c] = (await nodes(t, 3)) as [TestNode, TestNode, TestNode];
    a.router.durable(new Map([['sbx_1:1', 41]]));
    a.router.durable(new Map());
    b.router.durable(new Map([['sbx_2:1', 7]]));
    await until('b and c have their marks', () => b.marks.length === 1 && c.marks.length === 2);
    t.same(b.marks, [new Map([['sbx_1:1', 41]])]);
    t.same(c.marks, [new Map([['sbx_1:1', 41]]), new Map([['sbx_2:1', 7]])]);
    await until('a has b’s mark', () => a.marks.length >= 1);
    t.same(a.marks, [new Map([['sbx_2:1', 7]])], 'a heard only b, never its own');
  });

  t.test('a disconnection reaches every other node, not the sender, with its selector, code and reason', async (t) => {
    const [a, b, c] = (await nodes(t, 3)) as [TestNode, TestNode, TestNode];
    await a.router.disconnect({ accountId: 'acc_1' }, 4002, 'the account was deleted');
    const told = [{ who: { accountId: 'acc_1' }, code: 4002, reason: 'the account was deleted' }];
    await until('b and c were told', () => b.disconnected.length === 1 && c.disconnected.length === 1);
    t.same(b.disconnected, told);
    t.same(c.disconnected, told);
    // a's own request, were it heard, would arrive before b's.
    await b.router.disconnect({ runnerId: 'run_2' }, 4002, 'this runner was deleted by its owner');
    await until('a heard b', () => a.disconnected.length >= 1);
    t.same(
      a.disconnected,
      [{ who: { runnerId: 'run_2' }, code: 4002, reason: 'this runner was deleted by its owner' }],
      'a heard only b',
    );
  });

  t.test('closing a router rejects the commands it still waits for with runner_offline', async (t) => {
    const [a, b] = (await nodes(t, 2)) as [TestNode, TestNode];
    a.answer = () => new Promise<void>(() => {});
    a.router.hold('rnr_1');
    const sent = b.router.forward('rnr_1', interrupt('sbx_1')).catch((e: unknown) => e);
    await until('the holder ran the command', () => a.ran.length === 1);
    await b.router.close();
    t.equal(code(await sent), 'runner_offline');
  });
}
