import { type LogEvent, verifyWebhookSignature } from '@svc/core';
import t from 'tap';
import { exemptList } from '../../gateway/src/addresses.ts';
import { readLog } from '../../gateway/src/log/read.ts';
import { enqueueWebhookJobs } from '../../gateway/src/services/webhook-jobs.ts';
import { WebhookDeliveryWorker } from '../../gateway/src/workers/webhook-delivery.ts';
import { backends, signUp, startTestService, waitForMail } from './harness.ts';
import { checkPaging } from './paging.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { until } from './until.ts';
import { type Answer, type Received, startReceiver } from './webhook-receiver.ts';

const HOST = 'receiver.test';
const DAY = 86_400_000;

/** An ISO 8601 time with six fractional digits as microseconds since the epoch. */
const micros = (iso: string) => Date.parse(iso) * 1000 + Number(/\.\d{3}(\d{3})Z$/.exec(iso)?.[1]);

for (const backend of backends()) {
  t.test(`webhook delivery on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      // The service's own delivery worker stays off: the workers here run on a clock the test moves.
      env: { WEBHOOK_INTERVAL_MS: '0', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
    });
    const { http } = svc;
    const me = await signUp(svc);
    const token = me.key;
    const answers: Record<string, Answer> = {
      '/ok': { status: 200, body: 'thanks' },
      '/ok2': { status: 204 },
      '/fail': { status: 500, body: `down for maintenance ${'.'.repeat(6000)}` },
      '/redirect': { status: 302, headers: { location: '/ok' } },
      '/slow': 'hold',
    };
    const receiver = await startReceiver(t, HOST, (path) => answers[path] ?? { status: 404 });
    const base = `https://${HOST}:${receiver.port}`;
    // Ahead of the wall clock, so what the service queues as due now (tests, redeliveries) is due.
    let clock = new Date(Date.now() + 10 * 60_000);
    // receiver.test and internal.test are names only this resolver knows; 127.0.0.1 is let
    // through as an operator's WEBHOOK_ALLOW_CIDRS would, 10.0.0.0/8 is not.
    const worker = new WebhookDeliveryWorker(
      {
        sql: svc.db.sql,
        keyring: svc.keyring,
        mailer: svc.mailer,
        logger: svc.log,
        now: () => clock,
        publicUrl: () => svc.url,
        transport: {
          resolve: async (name) => (name === HOST ? ['127.0.0.1'] : name === 'internal.test' ? ['10.0.0.5'] : []),
          allowed: exemptList(['127.0.0.1/32']),
          ca: receiver.ca,
        },
      },
      { periodMs: 0, concurrency: 8, perEndpoint: 2, timeoutMs: 5000 },
    );
    /**
     * Passes until nothing more is due (each takes at most two jobs per endpoint), every request
     * answered and recorded; how many requests were sent.
     */
    const deliver = async () => {
      let sent = 0;
      for (;;) {
        const started = await worker.pass();
        await worker.settled();
        if (started === 0) return sent;
        sent += started;
      }
    };
    const create = async (body: Record<string, unknown>) => {
      const res = await http.post('/api/webhooks', { token, body });
      t.equal(res.status, 201, res.text);
      return res.body as { id: string; secret: string };
    };
    const deliveries = async (id: string) =>
      (await http.get(`/api/webhooks/${id}/deliveries?limit=200`, { token })).body.data as {
        id: string;
        event: string;
        type: string;
        try: number;
        result: number | null;
        detail: string;
      }[];
    const receivedOn = (path: string) => receiver.received.filter((r) => r.path === path);
    const verify = (r: Received, secret: string) =>
      verifyWebhookSignature({ header: r.headers['svc-signature'] as string, body: r.body, secret });

    const { agent } = await claudeAgent(t, http, token);
    const launched = await http.post('/api/conversations', {
      token,
      body: { agent_id: agent.id, prompt: 'the launch codes are 0000' },
    });
    t.equal(launched.status, 201, launched.text);
    const conversationId = launched.body.id as string;
    const logged = async () => readLog({ sql: svc.db.sql, log: svc.eventLog }, me.accountId, { after: 0, limit: 5000 });
    const events = await until('the turn to end in the log', async () => {
      const all = await logged();
      return all.some((e) => e.stage === 'turn' && e.state === 'done') && all;
    });

    let first: { id: string; secret: string };

    t.test(
      "a real conversation's stage events reach the receiver signed, as SPEC's payload, without content",
      async (t) => {
        first = await create({ url: `${base}/ok`, event_types: ['conversation.turn.*', 'conversation.provision.*'] });
        const wanted = events.filter((e) => e.kind === 'stage' && (e.stage === 'turn' || e.stage === 'provision'));
        t.ok(wanted.length >= 4, `turn and provision stage events: ${wanted.map((e) => `${e.stage}.${e.state}`)}`);
        t.ok(
          events.some((e) => e.kind !== 'stage'),
          'the log holds other events too (output), which make no webhooks',
        );
        t.equal(await enqueueWebhookJobs(svc.db.sql, me.accountId, events), wanted.length, 'one job per event');
        t.equal(await enqueueWebhookJobs(svc.db.sql, me.accountId, events), 0, 'a second read of the log adds none');
        t.equal(await deliver(), wanted.length);
        const got = receivedOn('/ok');
        t.equal(got.length, wanted.length, 'each delivered once');
        const byId = new Map<string, LogEvent>(wanted.map((e) => [String(e.id), e]));
        for (const r of got) {
          t.same(verify(r, first.secret).ok, true, 'the signature verifies with the secret');
          const body = JSON.parse(r.body);
          const e = byId.get(body.id) as LogEvent;
          t.ok(e, `${body.id} is a log event id`);
          t.same(Object.keys(body), ['id', 'type', 'created_at', 'data']);
          t.same(body.data, {
            conversation_id: conversationId,
            agent_id: agent.id,
            parent_conversation_id: null,
            status: 'idle',
            stage: e.stage,
            state: e.state,
            turn_id: e.stage === 'turn' ? e.turnId : null,
            duration_ms: e.durationMs,
          });
          t.equal(body.type, `conversation.${e.stage}.${e.state}`);
          t.match(body.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/, 'to the microsecond');
          t.equal(micros(body.created_at), e.id, 'the time the log took the id from');
          t.ok(Math.abs(micros(body.created_at) - Date.parse(e.ts) * 1000) < 1_000_000, 'within a second of ts');
          t.equal(r.headers['svc-event-id'], body.id);
          t.equal(r.headers['svc-event-type'], body.type);
          t.equal(r.headers['svc-delivery-attempt'], '1');
          t.equal(r.headers.host, `${HOST}:${receiver.port}`, 'the original host name in Host');
          t.equal(r.servername, HOST, 'and in TLS SNI');
          t.notMatch(r.body, /launch codes|You said/, 'no prompt, no output');
        }
        const listed = await deliveries(first.id);
        t.equal(listed.length, wanted.length);
        t.match(listed[0], { try: 1, result: 200, detail: 'thanks' });
      },
    );

    t.test('events appended together get distinct, ordered created_at values from a real clock', async (t) => {
      const together = await create({ url: `${base}/ok`, event_types: ['conversation.checkpoint_restore.*'] });
      const before = Date.now();
      const appended = await svc.appendEvents({
        tenant: me.accountId,
        producer: 'webhook-clock',
        seq: 1,
        events: ['started', 'done', 'failed'].map((state) => ({
          conversationId,
          kind: 'stage',
          stream: 'stage',
          stage: 'checkpoint_restore',
          state,
        })),
      });
      const after = Date.now();
      t.equal(new Set(appended.events.map((e) => e.ts)).size, 1, 'one append: one ts to the millisecond');
      t.equal(await enqueueWebhookJobs(svc.db.sql, me.accountId, appended.events), 3);
      t.equal(await deliver(), 3);
      const got = receivedOn('/ok')
        .map((r) => JSON.parse(r.body) as { id: string; created_at: string })
        .filter((b) => appended.events.some((e) => String(e.id) === b.id))
        .sort((a, b) => Number(a.id) - Number(b.id));
      t.equal(got.length, 3);
      const times = got.map((b) => micros(b.created_at));
      t.ok(
        times.every((us, i) => i === 0 || us > (times[i - 1] as number)),
        `strictly increasing in id order: ${got.map((b) => b.created_at)}`,
      );
      t.ok(
        times.every((us) => us >= before * 1000 && us < (after + 1) * 1000),
        'each within the wall-clock interval of the append',
      );
      await http.delete(`/api/webhooks/${together.id}`, { token });
    });

    t.test('rotation: the old secret stops verifying', async (t) => {
      const rotated = (await http.post(`/api/webhooks/${first.id}/rotate-secret`, { token })).body.secret as string;
      const queued = await http.post(`/api/webhooks/${first.id}/test`, { token });
      t.equal(queued.status, 202);
      t.match(queued.body, { status: 'queued', type: 'webhook.test', event: /^test_/ });
      t.equal(await deliver(), 1);
      const r = receivedOn('/ok').at(-1) as Received;
      t.match(JSON.parse(r.body), { id: queued.body.event, type: 'webhook.test' });
      t.same(verify(r, rotated), { ok: true, t: Number(/t=(\d+)/.exec(r.headers['svc-signature'] as string)?.[1]) });
      t.match(verify(r, first.secret), { ok: false, reason: 'signature does not match' });
      first.secret = rotated;
    });

    t.test('redeliver sends to the current URL with the current secret', async (t) => {
      const [earlier] = (await deliveries(first.id)).filter((d) => d.type === 'conversation.turn.done');
      t.ok(earlier);
      t.equal(
        (await http.call('PATCH', `/api/webhooks/${first.id}`, { token, body: { url: `${base}/ok2` } })).status,
        200,
      );
      const newest = (await http.post(`/api/webhooks/${first.id}/rotate-secret`, { token })).body.secret as string;
      const again = await http.post(`/api/webhooks/${first.id}/deliveries/${earlier?.id}/redeliver`, { token });
      t.equal(again.status, 202, again.text);
      t.same(again.body, { status: 'queued', event: earlier?.event, type: 'conversation.turn.done' });
      t.equal(await deliver(), 1);
      const [r] = receivedOn('/ok2');
      t.equal(JSON.parse(r?.body ?? '{}').id, earlier?.event, 'the same event');
      t.equal(r?.headers['svc-delivery-attempt'], '2');
      t.equal(verify(r as Received, newest).ok, true, 'signed with the newest secret');
      t.equal(verify(r as Received, first.secret).ok, false, 'not with the one before');
      t.match((await deliveries(first.id))[0], { event: earlier?.event, try: 2, result: 204 });
      const unknown = await http.post(`/api/webhooks/${first.id}/deliveries/whd_nope/redeliver`, { token });
      t.equal(unknown.status, 404);
    });

    t.test('a refused address is a failed attempt that says why', async (t) => {
      const inside = await create({ url: 'https://internal.test/hook', event_types: ['*'] });
      await http.post(`/api/webhooks/${inside.id}/test`, { token });
      t.equal(await deliver(), 1);
      t.match(await deliveries(inside.id), [
        { try: 1, result: null, detail: /refused: internal\.test resolves to 10\.0\.0\.5 is private/ },
      ]);
      await http.delete(`/api/webhooks/${inside.id}`, { token });
    });

    t.test('a 3xx is an answer to retry, never a redirect to follow', async (t) => {
      const moved = await create({ url: `${base}/redirect`, event_types: ['*'] });
      const before = receivedOn('/ok').length;
      await http.post(`/api/webhooks/${moved.id}/test`, { token });
      t.equal(await deliver(), 1);
      t.equal(receivedOn('/redirect').length, 1);
      t.equal(receivedOn('/ok').length, before, 'the Location was not followed');
      const [attempt] = await deliveries(moved.id);
      t.match(attempt, { try: 1, result: 302 });
      clock = new Date(clock.getTime() + DAY);
      t.equal(await deliver(), 1, 'retried');
      // A redelivery while retries are under way makes the event due now and keeps them.
      await http.post(`/api/webhooks/${moved.id}/deliveries/${attempt?.id}/redeliver`, { token });
      t.equal(await deliver(), 1, 'sent at once');
      clock = new Date(clock.getTime() + DAY);
      t.equal(await deliver(), 1, 'and retried after, as before');
      t.same(
        (await deliveries(moved.id)).map((d) => d.try),
        [4, 3, 2, 1],
      );
      await http.delete(`/api/webhooks/${moved.id}`, { token });
    });

    t.test('retries back off; 5 exhausted events disable the endpoint and mail the owner; resume', async (t) => {
      const failing = await create({ url: `${base}/fail`, event_types: ['conversation.turn.failed'] });
      const narrowed = { event_types: ['conversation.provision.*'] };
      t.equal((await http.call('PATCH', `/api/webhooks/${first.id}`, { token, body: narrowed })).status, 200);
      const turnId = events.find((e) => e.stage === 'turn')?.turnId ?? null;
      const appended = await svc.appendEvents({
        tenant: me.accountId,
        producer: 'webhook-test',
        seq: 1,
        events: Array.from({ length: 5 }, () => ({
          conversationId,
          turnId,
          kind: 'stage',
          stream: 'stage',
          stage: 'turn',
          state: 'failed',
        })),
      });
      t.equal(appended.status, 'appended');
      t.equal(await enqueueWebhookJobs(svc.db.sql, me.accountId, appended.events), 5);
      t.equal(await deliver(), 5, 'all five tried at once');
      clock = new Date(clock.getTime() + 59_000);
      t.equal(await deliver(), 0, 'nothing is due again within a minute');
      clock = new Date(clock.getTime() + 32_000);
      t.equal(await deliver(), 5, 'the second attempt comes within 90 s');
      for (let attempt = 3; attempt <= 8; attempt++) {
        t.equal((await http.get(`/api/webhooks/${failing.id}`, { token })).body.status, 'active');
        clock = new Date(clock.getTime() + 2 * DAY);
        t.equal(await deliver(), 5, `attempt ${attempt}`);
      }
      clock = new Date(clock.getTime() + 2 * DAY);
      t.equal(await deliver(), 0, 'no ninth attempt');
      const got = receivedOn('/fail');
      t.equal(got.length, 40);
      for (const e of appended.events) {
        t.same(
          got.filter((r) => r.headers['svc-event-id'] === String(e.id)).map((r) => r.headers['svc-delivery-attempt']),
          ['1', '2', '3', '4', '5', '6', '7', '8'],
        );
      }
      const endpoint = (await http.get(`/api/webhooks/${failing.id}`, { token })).body;
      t.match(endpoint, {
        status: 'disabled',
        disabled_reason: /^5 events in a row exhausted their retries.*HTTP 500/,
      });
      const mail = await waitForMail(svc.mailDir, me.email, /Webhook endpoint disabled/);
      t.match(mail.text, `/api/webhooks/${failing.id}/resume`);
      const listed = await deliveries(failing.id);
      t.equal(listed.length, 40);
      t.equal(listed[0]?.detail.length, 4096, 'the first 4 KB of the answer are kept');
      t.match(listed[0]?.detail, /^down for maintenance/);
      await checkPaging(
        t,
        {
          http,
          token,
          path: `/api/webhooks/${failing.id}/deliveries`,
          cursor: 'before',
          limit: 15,
          key: (r: { id: string }) => r.id,
        },
        listed.map((d) => d.id),
      );
      const audit = (await http.get('/api/audit?action_prefix=webhook.disabled', { token })).body.data;
      t.match(audit, [{ actor: 'system', resource_id: failing.id }]);

      const more = await svc.appendEvents({
        tenant: me.accountId,
        producer: 'webhook-test',
        seq: 6,
        events: [{ conversationId, turnId, kind: 'stage', stream: 'stage', stage: 'turn', state: 'failed' }],
      });
      t.equal(await enqueueWebhookJobs(svc.db.sql, me.accountId, more.events), 0, 'a disabled endpoint gets no jobs');

      const resumed = await http.post(`/api/webhooks/${failing.id}/resume`, { token });
      t.equal(resumed.status, 200);
      t.match(resumed.body, { status: 'active', disabled_reason: null, disabled_at: null });
      const rows = (await http.get('/api/audit?action_prefix=webhook.resumed', { token })).body.data;
      t.match(rows, [{ resource_id: failing.id, metadata: { via: 'resume' } }]);
      t.equal(await enqueueWebhookJobs(svc.db.sql, me.accountId, more.events), 1, 'active again');
      await http.delete(`/api/webhooks/${failing.id}`, { token });
    });

    t.test('a disabled endpoint keeps its pending deliveries; they go out once it is resumed', async (t) => {
      const paused = await create({ url: `${base}/ok2`, event_types: ['*'] });
      const queued = await http.post(`/api/webhooks/${paused.id}/test`, { token });
      t.equal(queued.status, 202);
      const off = await http.call('PATCH', `/api/webhooks/${paused.id}`, { token, body: { status: 'disabled' } });
      t.equal(off.body.status, 'disabled');
      const sentTo = () => receivedOn('/ok2').filter((r) => r.headers['svc-event-id'] === queued.body.event);
      t.equal(await deliver(), 0, 'nothing is sent while it is disabled');
      t.equal(sentTo().length, 0);
      t.equal((await http.post(`/api/webhooks/${paused.id}/resume`, { token })).status, 200);
      t.equal(await deliver(), 1, 'the delivery pending from before goes out after the resume');
      t.equal(sentTo().length, 1);
      await http.delete(`/api/webhooks/${paused.id}`, { token });
    });

    t.test("a slow receiver holds its own slots only, never another endpoint's", async (t) => {
      const slow = await create({ url: `${base}/slow` });
      const fast = await create({ url: `${base}/ok2` });
      for (let i = 0; i < 4; i++) {
        await http.post(`/api/webhooks/${slow.id}/test`, { token });
        await http.post(`/api/webhooks/${fast.id}/test`, { token });
      }
      const fastBefore = receivedOn('/ok2').length;
      await worker.pass();
      await until('the slow receiver to hold two requests', () => receiver.held === 2);
      await until('the fast endpoint to be answered', async () => (await deliveries(fast.id)).length >= 2);
      await worker.pass();
      await until('every fast delivery', async () => (await deliveries(fast.id)).length === 4);
      t.equal(receivedOn('/ok2').length - fastBefore, 4, 'the fast endpoint got all four');
      t.equal(receiver.held, 2, 'while the slow one holds two, its per-endpoint bound');
      t.equal(worker.sending, 2);
      receiver.release({ status: 200 });
      await worker.settled();
      // Answered while they are held, as the first two were (not left to the worker's timeout,
      // which would leave them due again, held again, in every later test's passes).
      const rest = deliver();
      await until('the slow receiver to hold the other two', () => receiver.held === 2);
      receiver.release({ status: 200 });
      t.equal(await rest, 2, 'the slow endpoint takes its other two once its slots free');
      t.equal((await deliveries(slow.id)).length, 4);
      t.same(
        (await deliveries(slow.id)).map((d) => d.result),
        [200, 200, 200, 200],
        'each answered, none timed out',
      );
    });

    t.test('an accepted delivery resets the count of exhausted events; so does PATCH status active', async (t) => {
      const flaky = await create({ url: `${base}/flaky`, event_types: ['conversation.session.done'] });
      let seq = 1;
      /** `n` new events for the endpoint, each sent until it is accepted or out of attempts. */
      const send = async (n: number) => {
        const appended = await svc.appendEvents({
          tenant: me.accountId,
          producer: 'webhook-flaky',
          seq,
          events: Array.from({ length: n }, () => ({
            conversationId,
            kind: 'stage',
            stream: 'stage',
            stage: 'session',
            state: 'done',
          })),
        });
        seq += n;
        t.equal(await enqueueWebhookJobs(svc.db.sql, me.accountId, appended.events), n);
        for (let i = 0; i < 8; i++) {
          clock = new Date(clock.getTime() + 2 * DAY);
          await deliver();
        }
      };
      const status = async () => (await http.get(`/api/webhooks/${flaky.id}`, { token })).body.status;
      answers['/flaky'] = { status: 503 };
      await send(4);
      answers['/flaky'] = { status: 200 };
      await send(1);
      answers['/flaky'] = { status: 503 };
      await send(4);
      t.equal(await status(), 'active', 'four, one accepted, four more: never five in a row');
      await send(1);
      t.equal(await status(), 'disabled', 'the fifth in a row disables');
      const resumed = await http.call('PATCH', `/api/webhooks/${flaky.id}`, { token, body: { status: 'active' } });
      t.equal(resumed.body.status, 'active');
      await send(4);
      t.equal(await status(), 'active', 'PATCH status active started the count again');
      await send(1);
      t.equal(await status(), 'disabled');
      await http.delete(`/api/webhooks/${flaky.id}`, { token });
    });

    t.test('delivery rows are pruned after 30 days', async (t) => {
      await http.post(`/api/webhooks/${first.id}/test`, { token });
      t.equal(await deliver(), 1);
      const kept = await deliveries(first.id);
      t.ok(kept.length > 0);
      clock = new Date(clock.getTime() + 29 * DAY);
      await deliver();
      t.same(await deliveries(first.id), kept, 'kept at 29 days');
      clock = new Date(clock.getTime() + 2 * DAY);
      await deliver();
      t.same(await deliveries(first.id), [], 'gone after 30');
    });
  });
}
