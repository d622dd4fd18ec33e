import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { backends } from './harness.ts';
import { teamSetUp } from './team-setup.ts';
import { until } from './until.ts';

/**
 * Files the tests create to let a setup script go on: outside /tmp, which an isolated sandbox
 * has a private one of, in a directory it can see (read-only, as it sees the machine).
 */
const GATES = fileURLToPath(new URL('../../.tap/gates/', import.meta.url));
mkdirSync(GATES, { recursive: true, mode: 0o755 });

// Each backend starts a service and builds a machine per teammate.

for (const backend of backends()) {
  t.test(`a teammate's life on ${backend}`, async (t) => {
    const { svc, http, token, other, agentOf, turnsOf, settled, presenceOf, online, teamStream } = await teamSetUp(
      t,
      backend,
    );

    t.test('the roster entry: last turn, preview, unread and presence follow the conversation', async (t) => {
      const agent = await agentOf(token, 'turing');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      const conv = added.conversation.id as string;
      await online(agent.id);
      const mate = async () => (await http.get(`/api/team/${agent.id}`, { token })).body;

      t.equal(
        (await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'slow hello' } })).status,
        202,
      );
      const working = await until('working', async () => {
        const m = await mate();
        return m.presence.state === 'working' ? m : undefined;
      });
      t.same(working.presence, { state: 'working', label: 'Working on a turn' });
      t.same(working.preview, { kind: 'typing', text: '' });
      t.equal(working.last_turn.state, 'running');
      const first = await settled(conv, 1);

      const after = await mate();
      t.same(after.presence, { state: 'online', label: 'Online' });
      t.equal(after.last_turn.id, first.id);
      t.equal(after.last_turn.reply, first.reply);
      t.equal(after.preview.kind, 'them');
      t.match(after.preview.text, /^You said: slow hello\./);
      t.equal(after.unread, true, 'a reply nobody read');
      t.equal(after.conversation.turn_count, 1);
      t.ok(after.usage_total.input > 0 && after.usage_total.output > 0, 'usage of the turn');
      t.same(after.usage_total, after.conversation.usage_total);
      t.equal((await http.post(`/api/conversations/${conv}/read`, { token })).status, 200);
      t.equal((await mate()).unread, false, 'read');

      t.equal(
        (await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'refuse env NOPE' } })).status,
        202,
      );
      const refused = await settled(conv, 2);
      t.equal(refused.state, 'failed');
      const unanswered = await mate();
      t.same(unanswered.preview, { kind: 'you', text: 'refuse env NOPE' }, 'a prompt with no reply');
      const roster = (await http.get('/api/team', { token })).body.data.find(
        (m: { agent_id: string }) => m.agent_id === agent.id,
      );
      t.same(roster, unanswered, 'the roster lists the same entry');
    });

    t.test('starting over: busy while a turn runs, then a new live conversation on the same machine', async (t) => {
      const agent = await agentOf(token, 'knuth');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id, name: 'Don' } })).body;
      const old = added.conversation.id as string;
      await online(agent.id);
      t.equal((await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'slow one' } })).status, 202);
      const busy = await http.post(`/api/team/${agent.id}/conversations`, { token });
      t.equal(busy.status, 400);
      t.equal(busy.body.error, 'conversation_busy');
      const first = await settled(old, 1);
      t.equal(first.state, 'done', 'the turn was not interrupted');

      const stream = teamStream(t);
      await stream.connected();
      const res = await http.post(`/api/team/${agent.id}/conversations`, { token });
      t.equal(res.status, 201, res.text);
      const fresh = res.body.conversation;
      t.not(fresh.id, old);
      t.match(fresh, { title: 'Don', channel_id: 'svc:team', turn_count: 0 });
      t.equal(fresh.sandbox_id, added.conversation.sandbox_id, 'the same machine');
      t.equal(res.body.teammate.conversation.id, fresh.id);
      t.same(res.body.teammate.presence, { state: 'online', label: 'Online' }, 'nothing was built');
      t.equal((await http.get(`/api/conversations/${old}`, { token })).body.status, 'terminated', 'retired');
      t.equal(
        (await http.get(`/api/sandboxes/${fresh.sandbox_id}`, { token })).body.status,
        'ready',
        'the machine is kept',
      );
      t.ok(
        await until('a team event', () => stream.events().some((e) => e.event === 'team')),
        'told the roster changed',
      );

      const history = (await http.get(`/api/team/${agent.id}/conversations`, { token })).body.data;
      t.same(
        history.map((c: { id: string; current: boolean }) => [c.id, c.current]),
        [
          [fresh.id, true],
          [old, false],
        ],
        'newest first, the live one flagged',
      );
      t.same(res.body.teammate.usage_total, (await http.get(`/api/conversations/${old}`, { token })).body.usage_total);

      t.equal((await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'again' } })).status, 202);
      await settled(fresh.id, 1);
      const mate = (await http.get(`/api/team/${agent.id}`, { token })).body;
      const usage = history.map((c: { usage_total: { input: number } }) => c.usage_total.input);
      t.ok(mate.usage_total.input > usage[1], 'usage sums every team conversation');
      t.equal(
        mate.usage_total.input,
        (await http.get(`/api/team/${agent.id}/conversations`, { token })).body.data.reduce(
          (n: number, c: { usage_total: { input: number } }) => n + c.usage_total.input,
          0,
        ),
      );

      const audit = (await http.get('/api/audit?action_prefix=team.conversation.rotated', { token })).body.data;
      t.match(audit[0], { resource_id: agent.id, metadata: { from: old, to: fresh.id, machine_kept: true } });
      t.equal((await http.get(`/api/team/${agent.id}/conversations`, { token: other.key })).status, 404);
      t.equal((await http.post(`/api/team/${agent.id}/conversations`, { token: other.key })).status, 404);
    });

    t.test(
      'starting over retires and opens in one transaction: a failure midway leaves one live conversation',
      async (t) => {
        const agent = await agentOf(token, 'wirth');
        const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
        const old = added.conversation.id as string;
        await online(agent.id);
        // The node "dies" while it retires the old conversation: the database refuses that write.
        const sql = svc.db.sql;
        if (!/^[a-z0-9_]+$/.test(old)) throw new Error(`unexpected id ${old}`);
        await sql.unsafe(`
        CREATE FUNCTION refuse_retire_test() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF OLD.id = '${old}' AND NEW.status = 'terminated' THEN RAISE EXCEPTION 'injected fault'; END IF;
          RETURN NEW;
        END $$`);
        await sql.unsafe(`CREATE TRIGGER refuse_retire_test BEFORE UPDATE ON conversations
        FOR EACH ROW EXECUTE FUNCTION refuse_retire_test()`);
        const dropped = async () => {
          await sql.unsafe('DROP TRIGGER IF EXISTS refuse_retire_test ON conversations');
          await sql.unsafe('DROP FUNCTION IF EXISTS refuse_retire_test()');
        };
        t.teardown(dropped);
        const failed = await http.post(`/api/team/${agent.id}/conversations`, { token });
        t.equal(failed.status, 500, failed.text);
        t.equal(failed.body.error, 'internal_error');

        const mate = (await http.get(`/api/team/${agent.id}`, { token })).body;
        t.equal(mate.conversation.id, old, 'the teammate still points at its old conversation');
        t.equal(mate.conversation.status, 'idle', 'which is still live');
        const history = (await http.get(`/api/team/${agent.id}/conversations`, { token })).body.data;
        t.same(
          history.map((c: { id: string; current: boolean }) => [c.id, c.current]),
          [[old, true]],
          'no second conversation was opened',
        );
        const ofAgent = (await http.get(`/api/conversations?agent_id=${agent.id}`, { token })).body.data;
        t.same(
          ofAgent.map((c: { id: string }) => c.id),
          [old],
          'none at all, on the channel or off it',
        );
        const audit = (await http.get('/api/audit?action_prefix=team.conversation.rotated', { token })).body.data;
        t.notOk(
          audit.some((r: { resource_id: string }) => r.resource_id === agent.id),
          'no rotation is recorded',
        );

        await dropped();
        const res = await http.post(`/api/team/${agent.id}/conversations`, { token });
        t.equal(res.status, 201, res.text);
        const live = (await http.get(`/api/team/${agent.id}/conversations`, { token })).body.data.filter(
          (c: { status: string }) => c.status !== 'terminated',
        );
        t.same(
          live.map((c: { id: string }) => c.id),
          [res.body.conversation.id],
          'once the fault is gone, one live conversation: the new one',
        );
      },
    );

    t.test('a teammate whose machine is being built: starting, and 503 provisioning', async (t) => {
      const gate = join(GATES, `gate-${process.pid}-${Date.now()}`);
      t.teardown(() => rmSync(gate, { force: true }));
      const gated = (
        await http.post('/api/environments', {
          token,
          body: { name: 'gated', setup_script: `until [ -e ${gate} ]; do sleep 0.05; done` },
        })
      ).body;
      const agent = await agentOf(token, 'patient', {}, gated.id);
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      t.same(added.presence, { state: 'starting', label: 'Starting its machine' });
      const msg = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'hi' } });
      t.equal(msg.status, 503);
      t.equal(msg.body.error, 'provisioning');
      t.ok(msg.headers.get('retry-after'), 'with Retry-After');
      const rotate = await http.post(`/api/team/${agent.id}/conversations`, { token });
      t.equal(rotate.status, 503);
      t.equal(rotate.body.error, 'provisioning');
      const schedule = (
        await http.post(`/api/team/${agent.id}/schedules`, { token, body: { cron: '@daily', prompt: 'report' } })
      ).body;
      const run = await http.post(`/api/team/${agent.id}/schedules/${schedule.id}/run`, { token });
      t.equal(run.status, 503, 'a schedule run now waits for the machine too');
      t.equal(run.body.error, 'provisioning');
      t.ok(run.headers.get('retry-after'), 'with Retry-After');
      const stamped = (await http.get(`/api/team/${agent.id}/schedules/${schedule.id}`, { token })).body;
      t.ok(stamped.last_run_at, 'the run is stamped');
      t.equal(stamped.last_error, run.body.message);
      t.equal(stamped.last_conversation_id, null);
      t.equal((await turnsOf(added.conversation.id)).length, 0, 'nothing recorded');
      writeFileSync(gate, '');
      await online(agent.id);
      t.equal((await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'hi' } })).status, 202);
      t.equal((await settled(added.conversation.id, 1)).state, 'done');
    });

    t.test('a teammate whose machine failed: failed, and starting over builds a new one', async (t) => {
      const ok = join(GATES, `ok-${process.pid}-${Date.now()}`);
      t.teardown(() => rmSync(ok, { force: true }));
      const flaky = (
        await http.post('/api/environments', { token, body: { name: 'flaky', setup_script: `[ -e ${ok} ] || exit 1` } })
      ).body;
      const agent = await agentOf(token, 'unlucky', {}, flaky.id);
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      const failed = await until(
        'failed',
        async () => {
          const p = await presenceOf(agent.id);
          return p.state === 'failed' ? p : undefined;
        },
        30_000,
      );
      t.match(failed.label, /failed/);
      writeFileSync(ok, '');
      const res = await http.post(`/api/team/${agent.id}/conversations`, { token });
      t.equal(res.status, 201, res.text);
      t.not(res.body.conversation.sandbox_id, added.conversation.sandbox_id, 'a new machine');
      await online(agent.id);
      const audit = (await http.get('/api/audit?action_prefix=team.conversation.rotated', { token })).body.data;
      t.match(audit[0], { resource_id: agent.id, metadata: { machine_kept: false } });
    });

    t.test('renaming retitles the live conversation and carries onto later ones; null restores', async (t) => {
      const agent = await agentOf(token, 'lamport');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      const stream = teamStream(t);
      await stream.connected();
      const res = await http.call('PATCH', `/api/team/${agent.id}`, { token, body: { name: ' Leslie ' } });
      t.equal(res.status, 200, res.text);
      t.equal(res.body.name, 'Leslie');
      t.equal(res.body.conversation.title, 'Leslie');
      t.equal((await http.get(`/api/conversations/${added.conversation.id}`, { token })).body.title, 'Leslie');
      t.ok(
        await until('a team event', () => stream.events().some((e) => e.event === 'team')),
        'told the roster changed',
      );
      const rotated = (await http.post(`/api/team/${agent.id}/conversations`, { token })).body;
      t.equal(rotated.conversation.title, 'Leslie', 'carried onto the next conversation');
      const audit = (await http.get('/api/audit?action_prefix=team.renamed', { token })).body.data;
      t.match(audit[0], { action: 'team.renamed', resource_id: agent.id });

      for (const name of [null, '  ']) {
        await http.call('PATCH', `/api/team/${agent.id}`, { token, body: { name: 'Temp' } });
        const restored = await http.call('PATCH', `/api/team/${agent.id}`, { token, body: { name } });
        t.equal(restored.status, 200);
        t.equal(restored.body.name, 'lamport', `${JSON.stringify(name)} restores the agent's name`);
        t.equal(restored.body.conversation.title, 'lamport');
      }

      const noName = await http.call('PATCH', `/api/team/${agent.id}`, { token, body: {} });
      t.equal(noName.status, 422);
      t.ok(noName.body.details.name);
      const wrongType = await http.call('PATCH', `/api/team/${agent.id}`, { token, body: { name: 5 } });
      t.equal(wrongType.status, 422);
      t.ok(wrongType.body.details.name);
      const theirs = await http.call('PATCH', `/api/team/${agent.id}`, { token: other.key, body: { name: 'x' } });
      t.equal(theirs.status, 404);
      t.equal((await http.get(`/api/team/${agent.id}`, { token })).body.name, 'lamport', 'untouched');
    });

    t.test('a deleted live conversation leaves the teammate away; the next message opens a fresh one', async (t) => {
      const agent = await agentOf(token, 'dijkstra');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      t.equal((await http.delete(`/api/conversations/${added.conversation.id}`, { token })).status, 204);
      const mate = (await http.get(`/api/team/${agent.id}`, { token })).body;
      t.equal(mate.conversation, null);
      t.equal(mate.presence.state, 'away');
      t.match(mate.presence.label, /fresh conversation/);
      const res = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'back?' } });
      t.equal(res.status, 202, res.text);
      t.not(res.body.conversation_id, added.conversation.id);
      t.equal((await settled(res.body.conversation_id, 1)).state, 'done');
      t.equal((await http.get(`/api/team/${agent.id}`, { token })).body.presence.state, 'online');
    });

    t.test('a teammate whose machine was reset is offline; the next message builds it again', async (t) => {
      const agent = await agentOf(token, 'hoare');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      t.equal((await http.delete(`/api/sandboxes/${added.conversation.sandbox_id}`, { token })).status, 204);
      const offline = await presenceOf(agent.id);
      t.equal(offline.state, 'offline');
      t.match(offline.label, /next message starts its machine/);
      const res = await http.post(`/api/team/${agent.id}/messages`, { token, body: { prompt: 'rebuilt?' } });
      t.equal(res.status, 202, res.text);
      t.equal(res.body.conversation_id, added.conversation.id, 'the same conversation');
      t.equal((await settled(added.conversation.id, 1)).state, 'done');
      t.equal((await presenceOf(agent.id)).state, 'online');
    });

    t.test('removing a teammate terminates its conversation and unbinds its history', async (t) => {
      const agent = await agentOf(token, 'hamilton');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      const rotated = (await http.post(`/api/team/${agent.id}/conversations`, { token })).body;
      const ids = [added.conversation.id, rotated.conversation.id];
      const onChannel = async () =>
        ((await http.get('/api/conversations?channel_id=svc:team', { token })).body.data as { id: string }[]).map(
          (c) => c.id,
        );
      const before = await onChannel();
      t.ok(
        ids.every((id) => before.includes(id)),
        'its history is on the team channel',
      );
      const stream = teamStream(t);
      await stream.connected();
      const res = await http.delete(`/api/team/${agent.id}`, { token });
      t.equal(res.status, 204);
      const live = (await http.get(`/api/conversations/${rotated.conversation.id}`, { token })).body;
      t.equal(live.status, 'terminated', 'the live conversation ended');
      t.equal(live.channel_id, null, 'unbound');
      const after = await onChannel();
      t.notOk(
        ids.some((id) => after.includes(id)),
        'no conversation of it is listed on the team channel',
      );
      t.equal((await http.get(`/api/team/${agent.id}`, { token })).status, 404);
      t.equal((await http.get(`/api/team/${agent.id}/conversations`, { token })).status, 404);
      const roster = (await http.get('/api/team', { token })).body.data as { agent_id: string }[];
      t.notOk(
        roster.some((m) => m.agent_id === agent.id),
        'off the roster',
      );
      t.ok(
        await until('a team event', () => stream.events().some((e) => e.event === 'team')),
        'told the roster changed',
      );
      const sandbox = (await http.get(`/api/sandboxes/${added.conversation.sandbox_id}`, { token })).body;
      t.equal(sandbox.status, 'ready', 'its lasting machine is kept');
      t.equal((await http.delete(`/api/team/${agent.id}`, { token })).status, 404, 'once');
      const audit = (await http.get('/api/audit?action_prefix=team.removed', { token })).body.data;
      t.equal(audit.length, 1, 'audited once');
      t.match(audit[0], { action: 'team.removed', resource_type: 'agent', resource_id: agent.id });

      const back = await http.post('/api/team', { token, body: { agent_id: agent.id } });
      t.equal(back.status, 201, 'it can join again');
      t.equal(back.body.conversation.sandbox_id, added.conversation.sandbox_id, 'on the machine it kept');
      const history = (await http.get(`/api/team/${agent.id}/conversations`, { token })).body.data;
      t.same(
        history.map((c: { id: string }) => c.id),
        [back.body.conversation.id],
        'with a history of its own',
      );
      t.equal((await http.delete(`/api/team/${agent.id}`, { token: other.key })).status, 404, 'not by another tenant');
    });

    t.test('deleting an agent on the team takes it off the team first', async (t) => {
      const agent = await agentOf(token, 'lovelace');
      const added = (await http.post('/api/team', { token, body: { agent_id: agent.id } })).body;
      await online(agent.id);
      const stream = teamStream(t);
      await stream.connected();
      t.equal((await http.delete(`/api/agents/${agent.id}`, { token })).status, 204);
      const conv = (await http.get(`/api/conversations/${added.conversation.id}`, { token })).body;
      t.match(conv, { status: 'terminated', channel_id: null }, 'its live conversation ended and left the channel');
      const roster = (await http.get('/api/team', { token })).body.data as { agent_id: string }[];
      t.notOk(
        roster.some((m) => m.agent_id === agent.id),
        'off the roster',
      );
      t.ok(
        await until('a team event', () => stream.events().some((e) => e.event === 'team')),
        'told the roster changed',
      );
      const audit = (await http.get('/api/audit?action_prefix=team.removed', { token })).body.data;
      t.ok(
        audit.some((a: { resource_id: string }) => a.resource_id === agent.id),
        'audited as a removal',
      );
    });
  });
}
