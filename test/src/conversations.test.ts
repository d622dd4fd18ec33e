import { conversations } from '@svc/db';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { checkPaging } from './paging.ts';

for (const backend of backends()) {
  t.test(`conversations and turns as records on ${backend}`, async (t) => {
    const svc = await startTestService(t, { backend });
    const { http } = svc;
    const sql = svc.db.sql;
    const me = await signUp(svc);
    const other = await signUp(svc);
    const token = me.key;
    const env = (await http.post('/api/environments', { token, body: { name: 'e' } })).body;
    const agent = (
      await http.post('/api/agents', {
        token,
        body: { name: 'a', runtime: 'claude', model: 'anthropic/x', environment_id: env.id },
      })
    ).body;
    const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
    const root = await createConversationRecord(sql, who, { agentId: agent.id, title: 'root' });
    const child = await createConversationRecord(sql, who, {
      agentId: agent.id,
      title: 'child',
      source: 'agent',
      parentId: root.id,
    });
    const grandchild = await createConversationRecord(sql, who, {
      agentId: agent.id,
      source: 'agent',
      parentId: child.id,
    });
    const team = await createConversationRecord(sql, who, {
      agentId: 'agt_other',
      title: 'team',
      channelId: 'svc:team',
    });
    const theirs = await createConversationRecord(
      sql,
      { accountId: other.accountId, actor: 'api', ip: null },
      { agentId: 'x' },
    );

    t.test('list, filters, and 400 invalid_status', async (t) => {
      const ids = async (q: string) =>
        (await http.get(`/api/conversations${q}`, { token })).body.data.map((c: { id: string }) => c.id).sort();
      t.same(await ids(''), [root.id, child.id, grandchild.id, team.id].sort());
      t.same(await ids('?roots_only=true'), [root.id, team.id].sort());
      t.same(await ids(`?agent_id=${agent.id}&roots_only=true`), [root.id]);
      t.same(await ids('?channel_id=svc:team'), [team.id]);
      t.same(await ids('?status=idle,running'), [root.id, child.id, grandchild.id, team.id].sort());
      t.same(await ids('?status=terminated'), []);
      const bad = await http.get('/api/conversations?status=idle,sleeping', { token });
      t.equal(bad.status, 400);
      t.equal(bad.body.error, 'invalid_status');
      t.equal(
        (await http.get(`/api/agents/${agent.id}`, { token })).body.conversation_count,
        3,
        "the agent's conversation_count counts",
      );
    });

    t.test('unread: never read is unread; read clears it; activity sets it again', async (t) => {
      const before = await http.get(`/api/conversations/${root.id}`, { token });
      t.match(before.body, {
        title: 'root',
        status: 'idle',
        source: 'ui',
        parent_id: null,
        unread: true,
        last_read_at: null,
        turn_count: 0,
      });
      const read = await http.post(`/api/conversations/${root.id}/read`, { token });
      t.equal(read.body.unread, false);
      await new Promise((r) => setTimeout(r, 20));
      const turn = (await conversations.startTurn(sql, {
        id: 'trn_1',
        accountId: me.accountId,
        conversationId: root.id,
        prompt: 'hello',
        origin: 'user',
      })) as conversations.TurnRow;
      const running = await http.get(`/api/conversations/${root.id}`, { token });
      t.match(running.body, { status: 'running', unread: true, turn_count: 1 });
      t.ok(
        Date.parse(running.body.last_active_at) > Date.parse(read.body.last_active_at),
        'last_active_at moved at turn start',
      );
      t.ok(await conversations.endTurn(sql, me.accountId, turn.id, 'done', { input: 120, output: 30 }));
      t.notOk(await conversations.endTurn(sql, me.accountId, turn.id, 'failed', null), 'a turn ends once');
      await conversations.startTurn(sql, {
        id: 'trn_2',
        accountId: me.accountId,
        conversationId: root.id,
        prompt: 'again',
        origin: 'autonomous',
      });
      await conversations.endTurn(sql, me.accountId, 'trn_2', 'interrupted', { input: 10, output: 5 });
      await conversations.startTurn(sql, {
        id: 'trn_3',
        accountId: me.accountId,
        conversationId: root.id,
        prompt: 'third',
        origin: 'user',
      });
      const after = await http.get(`/api/conversations/${root.id}`, { token });
      t.same(after.body.usage_total, { input: 130, output: 35 }, 'usage_total sums the turns that reported usage');
      const turns = await http.get(`/api/conversations/${root.id}/turns`, { token });
      t.same(
        turns.body.data.map((x: { number: number; state: string; origin: string; usage: unknown }) => [
          x.number,
          x.state,
          x.origin,
          x.usage,
        ]),
        [
          [1, 'done', 'user', { input: 120, output: 30 }],
          [2, 'interrupted', 'autonomous', { input: 10, output: 5 }],
          [3, 'running', 'user', null],
        ],
      );
    });

    t.test('the spawn tree is flat, ancestors and descendants, from any member', async (t) => {
      for (const from of [root, child, grandchild]) {
        const tree = await http.get(`/api/conversations/${from.id}/tree`, { token });
        t.same(
          tree.body.data.map((x: { id: string; parent_id: string | null }) => [x.id, x.parent_id]),
          [
            [root.id, null],
            [child.id, root.id],
            [grandchild.id, child.id],
          ],
        );
      }
    });

    t.test('the JSON feed pages oldest first, filters streams, and validates its query', async (t) => {
      const events = Array.from({ length: 25 }, (_, i) =>
        i % 5 === 4
          ? {
              conversationId: child.id,
              kind: 'stage',
              stream: 'stage',
              stage: 'turn',
              state: 'done',
              durationMs: 1000 + i,
            }
          : { conversationId: child.id, kind: 'output', stream: i % 2 ? 'stderr' : 'stdout', data: `line ${i}` },
      );
      await svc.appendEvents({ tenant: me.accountId, producer: 'test', seq: 1, events });
      await svc.appendEvents({
        tenant: me.accountId,
        producer: 'test2',
        seq: 1,
        events: [{ conversationId: root.id, kind: 'output', stream: 'stdout', data: 'other' }],
      });
      const pages: number[][] = [];
      let after = 0;
      for (;;) {
        const res = await http.get(`/api/conversations/${child.id}/events?limit=10&after=${after}`, { token });
        t.equal(res.status, 200);
        pages.push(res.body.data.map((e: { id: number }) => e.id));
        if (!res.body.meta.has_more) {
          t.equal(res.body.meta.next_cursor, null);
          break;
        }
        after = res.body.meta.next_cursor;
      }
      t.same(
        pages.map((p) => p.length),
        [10, 10, 5],
      );
      const flat = pages.flat();
      t.ok(
        flat.every((id, i) => i === 0 || id > (flat[i - 1] as number)),
        'oldest first, no repeats',
      );
      const first = await http.get(`/api/conversations/${child.id}/events?limit=1`, { token });
      t.match(first.body.data[0], {
        kind: 'output',
        stream: 'stdout',
        data: 'line 0',
        stage: null,
        state: null,
        duration_ms: null,
        turn_id: null,
      });
      const stages = await http.get(`/api/conversations/${child.id}/events?streams=stage`, { token });
      t.equal(stages.body.data.length, 5);
      t.match(stages.body.data[0], { kind: 'stage', stage: 'turn', state: 'done', duration_ms: 1004 });
      const two = await http.get(`/api/conversations/${child.id}/events?streams=stdout,stage&limit=3`, { token });
      t.same(
        two.body.data.map((e: { stream: string }) => e.stream),
        ['stdout', 'stdout', 'stage'],
        'lines 0 and 2, then the stage event 4',
      );
      t.equal(two.body.meta.has_more, true);
      const plain = await http.get(`/api/conversations/${child.id}/events?limit=5`, { token });
      t.notOk('blocks' in plain.body.data[0], 'without the flag there is no blocks field');
      const withBlocks = await http.get(`/api/conversations/${child.id}/events?limit=5&blocks=true`, { token });
      t.same(
        withBlocks.body.data[0].blocks,
        [{ kind: 'raw', body: 'line 0', summary: 'line 0' }],
        'plain output is a raw block',
      );
      t.same(withBlocks.body.data[4].blocks, [], 'an event that is not output has blocks: []');
      for (const bad of ['limit=0', 'limit=1001', 'after=-1', 'streams=video', 'blocks=yes']) {
        t.equal((await http.get(`/api/conversations/${child.id}/events?${bad}`, { token })).status, 400, bad);
      }
      await svc.copier.pass();
      const fromPostgres =
        await sql`SELECT count(*)::int AS n FROM log_events WHERE account_id = ${me.accountId} AND conversation_id = ${child.id}`;
      t.equal(fromPostgres[0]?.n, 25, 'the copier stored them');
    });

    t.test('paging the JSON feed by after returns every event once, from Postgres and the hot log', async (t) => {
      const paged = await createConversationRecord(sql, who, { agentId: agent.id, title: 'paged' });
      const line = (i: number) => ({ conversationId: paged.id, kind: 'output', stream: 'stdout', data: `p${i}` });
      const lines = Array.from({ length: 25 }, (_, i) => `p${i}`);
      await svc.appendEvents({
        tenant: me.accountId,
        producer: 'paged',
        seq: 1,
        events: lines.slice(0, 12).map((_, i) => line(i)),
      });
      await svc.copier.pass();
      await svc.appendEvents({
        tenant: me.accountId,
        producer: 'paged',
        seq: 13,
        events: lines.slice(12).map((_, i) => line(i + 12)),
      });
      await checkPaging(
        t,
        {
          http,
          token,
          path: `/api/conversations/${paged.id}/events`,
          cursor: 'after',
          limit: 4,
          key: (e: { data: string }) => e.data,
        },
        lines,
      );
    });

    t.test("another tenant's conversation is 404 on every route", async (t) => {
      for (const [method, path] of [
        ['GET', `/api/conversations/${theirs.id}`],
        ['DELETE', `/api/conversations/${theirs.id}`],
        ['POST', `/api/conversations/${theirs.id}/read`],
        ['GET', `/api/conversations/${theirs.id}/turns`],
        ['GET', `/api/conversations/${theirs.id}/tree`],
        ['GET', `/api/conversations/${theirs.id}/events`],
      ] as const) {
        const res = await http.call(method, path, { token });
        t.equal(res.status, 404, `${method} ${path}`);
      }
      t.equal((await http.get(`/api/conversations/${theirs.id}`, { token: other.key })).status, 200);
    });

    t.test('delete removes the conversation, its turns and its log', async (t) => {
      t.equal((await http.delete(`/api/conversations/${child.id}`, { token })).status, 204);
      t.equal((await http.get(`/api/conversations/${child.id}`, { token })).status, 404);
      const left =
        await sql`SELECT count(*)::int AS n FROM log_events WHERE account_id = ${me.accountId} AND conversation_id = ${child.id}`;
      t.equal(left[0]?.n, 0);
      const gc = await http.get(`/api/conversations/${grandchild.id}`, { token });
      t.equal(gc.body.parent_id, null, 'a child of a deleted conversation loses its parent link');
    });
  });
}
