import { RUNNER_CLOSE } from '@svc/core';
import t from 'tap';
import { backends, signUp, startTestService } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import { blockText, type WireEvent } from './sse-client.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';

interface TurnWire {
  id: string;
  number: number;
  state: string;
  image_count: number;
  prompt: string;
}

for (const backend of backends()) {
  t.test(`the life of a conversation: prompts, interrupt, terminate, images (${backend})`, async (top) => {
    const t = top;
    const svc = await startTestService(t, {
      backend,
      // A grace that outlasts a reconnect attempt failing on a loaded machine, with its backoff.
      env: { RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '5000', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const other = await signUp(svc);
    const token = me.key;
    const setup = await claudeOnRunner(t, svc, token);
    const { agent, runnerRow } = setup;
    let { runner } = setup;

    const feed = async (id: string) =>
      (await http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as WireEvent[];
    const turnsOf = async (id: string) =>
      (await http.get(`/api/conversations/${id}/turns`, { token })).body.data as TurnWire[];
    /** Waits for the conversation's turn `number` to leave `running`. */
    const settled = async (id: string, number: number) => {
      let turns: TurnWire[] = [];
      for (let i = 0; i < 400; i++) {
        turns = await turnsOf(id);
        const turn = turns.find((x) => x.number === number);
        if (turn && turn.state !== 'running') return turn;
        await sleep(50);
      }
      throw new Error(`turn ${number} still running: ${JSON.stringify(turns)}\n${runner.output}`);
    };
    const replyOf = (events: WireEvent[], turnId: string) => blockText(events, 'text', turnId);
    /** Waits until the turn's runtime has sent something (it is under way). */
    const underWay = async (id: string) => {
      for (let i = 0; i < 300; i++) {
        if ((await feed(id)).some((e) => e.stream === 'acp')) return;
        await sleep(50);
      }
      throw new Error('the turn never got under way');
    };

    const first = await http.post('/api/conversations', {
      token,
      body: { agent_id: agent.id, prompt: 'look at this', images: [{ data: PNG, media_type: 'image/png' }] },
    });
    t.equal(first.status, 201, JSON.stringify(first.body));
    const id = first.body.id as string;

    t.test('the first turn carries its image to the runtime, and the image is served back', async (t) => {
      const turn = await settled(id, 1);
      t.match(turn, { state: 'done', image_count: 1, prompt: 'look at this' });
      t.match(replyOf(await feed(id), turn.id), /1 image\(s\): image\/png/, 'the runtime got the image');
      const img = await fetch(`${svc.url}/api/conversations/${id}/turns/${turn.id}/images/0`, {
        headers: { authorization: `Bearer ${token}` },
      });
      t.equal(img.status, 200);
      t.equal(img.headers.get('content-type'), 'image/png');
      t.same(Buffer.from(await img.arrayBuffer()), Buffer.from(PNG, 'base64'), 'the same bytes');
      const missing = await http.get(`/api/conversations/${id}/turns/${turn.id}/images/1`, { token });
      t.equal(missing.status, 404);
      t.equal(missing.body.error, 'not_found');
      const stranger = await http.get(`/api/conversations/${id}/turns/${turn.id}/images/0`, { token: other.key });
      t.equal(stranger.status, 404, 'another tenant gets 404');
    });

    t.test('a follow-up prompt runs on the same sandbox and runtime session', async (t) => {
      const res = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'and now this' } });
      t.equal(res.status, 201, JSON.stringify(res.body));
      t.match(res.body, { number: 2, state: 'running', prompt: 'and now this', origin: 'user', image_count: 0 });
      const turn = await settled(id, 2);
      t.equal(turn.state, 'done');
      const events = await feed(id);
      t.match(replyOf(events, turn.id), /^You said: and now this\./);
      t.same(
        events.filter((e) => e.turn_id === turn.id && e.kind === 'stage').map((e) => `${e.stage} ${e.state}`),
        ['turn started', 'turn done'],
        'no new build and no new session',
      );
      const conv = (await http.get(`/api/conversations/${id}`, { token })).body;
      t.match(conv, { status: 'idle', turn_count: 2 });
      const [stored] = await svc.db.sql<{ reply: string }[]>`SELECT reply FROM turns WHERE id = ${turn.id}`;
      t.equal(stored?.reply, replyOf(events, turn.id), 'the reply text is stored when the turn ends');
      t.match(stored?.reply, /^You said: and now this\.$/);
      const audit = (await http.get('/api/audit?resource_type=turn', { token })).body.data as {
        action: string;
        actor: string;
        resource_id: string;
        metadata: { state: string };
      }[];
      t.match(
        audit.find((a) => a.resource_id === turn.id),
        { action: 'turn.ended', actor: 'system', metadata: { state: 'done' } },
        'the turn’s end is audited',
      );
      const actions = (await http.get('/api/audit?resource_type=conversation', { token })).body.data.map(
        (a: { action: string }) => a.action,
      );
      t.ok(
        actions.includes('conversation.prompted') && actions.includes('conversation.created'),
        'and so is the prompt',
      );
    });

    t.test('a prompt while a turn runs: 400 conversation_busy, nothing recorded', async (t) => {
      const slow = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'be slow' } });
      t.equal(slow.status, 201);
      const busy = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'me too' } });
      t.equal(busy.status, 400);
      t.equal(busy.body.error, 'conversation_busy');
      t.equal((await turnsOf(id)).length, 3, 'no turn was added');

      t.test('interrupt: the turn ends interrupted, the sandbox stays', async (t) => {
        await underWay(id);
        const res = await http.post(`/api/conversations/${id}/interrupt`, { token });
        t.equal(res.status, 200);
        t.equal(res.body.id, id);
        const turn = await settled(id, 3);
        t.equal(turn.state, 'interrupted');
        const end = (await feed(id)).find((e) => e.turn_id === turn.id && e.stage === 'turn' && e.state !== 'started');
        t.equal(end?.state, 'interrupted', 'the log says so');
        t.notMatch(replyOf(await feed(id), turn.id), /tick 7/, 'the reply stopped');
        const [sandbox] = await svc.db.sql<
          { status: string }[]
        >`SELECT status FROM sandboxes WHERE id = ${first.body.sandbox_id}`;
        t.equal(sandbox?.status === 'terminated', false, 'the sandbox is still there');
        const again = await http.post(`/api/conversations/${id}/interrupt`, { token });
        t.equal(again.status, 200, 'nothing running: nothing to stop');
        t.equal(again.body.status, 'idle');
      });
    });

    t.test('the server cuts the runner’s connection mid-turn, twice: the reply arrives whole, once', async (t) => {
      const res = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'be slow' } });
      t.equal(res.status, 201);
      await underWay(id);
      for (const pause of [600, 900]) {
        await sleep(pause);
        // The runner reconnects after a random backoff (and a hello that writes to the database):
        // the second cut waits until it is back rather than guess how long that takes.
        for (let i = 0; i < 200 && !svc.fabric.isLive(runnerRow.id); i++) await sleep(25);
        t.ok(
          svc.fabric.disconnectHere({ runnerId: runnerRow.id }, RUNNER_CLOSE.going_away, 'test cut'),
          `cut\n${runner.output}`,
        );
      }
      const turn = await settled(id, res.body.number);
      t.equal(turn.state, 'done');
      const events = await feed(id);
      t.equal(
        replyOf(events, turn.id),
        'You said: be slow. tick 0 tick 1 tick 2 tick 3 tick 4 tick 5 tick 6 tick 7',
        'nothing lost, nothing doubled',
      );
      const ids = events.map((e) => e.id);
      t.same(
        ids,
        [...new Set(ids)].sort((x, y) => x - y),
        'ids unique and increasing',
      );
      t.match(runner.output, /reconnect|connected as runner[\s\S]*connected as runner/, 'the runner reconnected');
    });

    t.test('bad images are refused and change nothing', async (t) => {
      const before = (await turnsOf(id)).length;
      const wrongType = await http.post(`/api/conversations/${id}/prompts`, {
        token,
        body: { prompt: 'see', images: [{ data: PNG, media_type: 'image/jpeg' }] },
      });
      t.equal(wrongType.status, 415);
      t.match(wrongType.body, { error: 'unsupported_media_type', message: /image\/png, not image\/jpeg/ });
      const notImage = await http.post(`/api/conversations/${id}/prompts`, {
        token,
        body: { prompt: 'see', images: [{ data: Buffer.from('hello').toString('base64'), media_type: 'image/png' }] },
      });
      t.equal(notImage.status, 415);
      const notBase64 = await http.post(`/api/conversations/${id}/prompts`, {
        token,
        body: { prompt: 'see', images: [{ data: '%%%', media_type: 'image/png' }] },
      });
      t.equal(notBase64.status, 422);
      t.equal(notBase64.body.error, 'validation_failed');
      t.equal((await turnsOf(id)).length, before, 'no turn was added');
    });

    t.test('another tenant gets 404 on every route', async (t) => {
      for (const path of ['prompts', 'interrupt', 'terminate']) {
        const res = await http.post(`/api/conversations/${id}/${path}`, {
          token: other.key,
          body: path === 'prompts' ? { prompt: 'hi' } : undefined,
        });
        t.equal(res.status, 404, path);
        t.equal(res.body.error, 'not_found', path);
      }
      t.equal((await http.get(`/api/conversations/${id}`, { token })).body.status, 'idle', 'untouched');
    });

    t.test('a sandbox whose machine failed is built again, as its next incarnation', async (t) => {
      await svc.db.sql`UPDATE sandboxes SET status = 'failed' WHERE id = ${first.body.sandbox_id}`;
      const res = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'fresh start' } });
      t.equal(res.status, 201, JSON.stringify(res.body));
      const turn = await settled(id, res.body.number);
      t.equal(turn.state, 'done');
      const events = await feed(id);
      t.same(
        events.filter((e) => e.turn_id === turn.id && e.kind === 'stage').map((e) => `${e.stage} ${e.state}`),
        ['sandbox started', 'turn started', 'session started', 'session done', 'turn done'],
      );
      const builds = events.filter((e) => e.stage === 'provision' && e.state === 'done');
      t.equal(builds.length, 2, 'built twice in all');
      const [sandbox] = await svc.db.sql<
        { incarnation: number }[]
      >`SELECT incarnation FROM sandboxes WHERE id = ${first.body.sandbox_id}`;
      t.equal(sandbox?.incarnation, 1);
      const listed = (await http.get(`/api/sandboxes/${first.body.sandbox_id}`, { token })).body;
      t.match(listed, { status: 'ready', conversations: [{ id, mid_turn: false }] }, 'ready again');
    });

    t.test(
      'runner away: 503 runner_offline for a prompt, nothing recorded; interrupt ends the turn here',
      async (t) => {
        const slow = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'be slow' } });
        t.equal(slow.status, 201);
        await underWay(id);
        runner.child.kill('SIGKILL');
        for (let i = 0; i < 100; i++) {
          const list = (await http.get('/api/runners', { token })).body.data as { online: boolean }[];
          if (!list[0]?.online) break;
          await sleep(50);
        }
        const stop = await http.post(`/api/conversations/${id}/interrupt`, { token });
        t.equal(stop.status, 200);
        t.equal(stop.body.status, 'idle', 'ended here at once');
        const turn = await settled(id, slow.body.number);
        t.equal(turn.state, 'interrupted');
        let end: WireEvent | undefined;
        for (let i = 0; i < 100 && !end; i++) {
          end = (await feed(id)).find((e) => e.turn_id === turn.id && e.stage === 'turn' && e.state === 'interrupted');
          if (!end) await sleep(50);
        }
        t.match(JSON.parse(end?.data ?? '{}'), { error: /runner is not connected/ });
        const before = (await turnsOf(id)).length;
        const res = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'anyone?' } });
        t.equal(res.status, 503);
        t.equal(res.body.error, 'runner_offline');
        t.ok(res.headers.get('retry-after'), 'with Retry-After');
        t.equal((await turnsOf(id)).length, before, 'no turn was added');
        // Back for the tests that follow (its process ends with the whole test, not this one).
        runner = await startRunnerProcess(top, svc.url, runnerRow.token);
      },
    );

    t.test('delete mid-turn: the conversation goes, the runner stays connected and works on', async (t) => {
      const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'be slow' } });
      t.equal(res.status, 201);
      const cid = res.body.id as string;
      await underWay(cid);
      const del = await http.delete(`/api/conversations/${cid}`, { token });
      t.equal(del.status, 204);
      t.equal((await http.get(`/api/conversations/${cid}`, { token })).status, 404);
      // What the runtime said after the delete (its turn's end, at least) is dropped, not kept.
      await sleep(1500);
      const left = await svc.db.sql`SELECT 1 FROM log_events WHERE conversation_id = ${cid}`;
      t.equal(left.length, 0, 'nothing of it is left in the copy');
      t.equal(runner.child.exitCode, null, 'the runner is still running');
      t.notMatch(runner.output, /refused|connection lost \(4003/, 'and was never refused');
      const next = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'after' } });
      t.equal(next.status, 201);
      t.equal((await settled(next.body.id, 1)).state, 'done', 'the runner takes the next conversation');
    });

    t.test('terminate: the running turn ends interrupted, the sandbox goes, then 410', async (t) => {
      const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'be slow' } });
      t.equal(res.status, 201, JSON.stringify(res.body));
      const cid = res.body.id as string;
      await underWay(cid);
      const end = await http.post(`/api/conversations/${cid}/terminate`, { token });
      t.equal(end.status, 200);
      t.match(end.body, { id: cid, status: 'terminated' });
      const [turn] = await turnsOf(cid);
      t.equal(turn?.state, 'interrupted');
      const events = await feed(cid);
      t.ok(
        events.some((e) => e.stage === 'terminate' && e.state === 'done'),
        'a terminate stage event',
      );
      const [sandbox] = await svc.db.sql<
        { status: string }[]
      >`SELECT status FROM sandboxes WHERE id = ${res.body.sandbox_id}`;
      t.equal(sandbox?.status, 'terminated', 'an ephemeral sandbox is destroyed');
      for (const path of ['prompts', 'interrupt', 'terminate']) {
        const again = await http.post(`/api/conversations/${cid}/${path}`, {
          token,
          body: path === 'prompts' ? { prompt: 'hi' } : undefined,
        });
        t.equal(again.status, 410, path);
        t.equal(again.body.error, 'conversation_terminated', path);
      }
      t.equal((await turnsOf(cid)).length, 1, 'no turn was added');
      const listed = (await http.get('/api/conversations?status=terminated', { token })).body.data as { id: string }[];
      t.same(
        listed.map((c) => c.id),
        [cid],
        'listed as terminated',
      );
      // The runner's own end of the cancelled turn comes later and changes nothing.
      await sleep(500);
      t.equal((await turnsOf(cid))[0]?.state, 'interrupted');
    });
  });
}
