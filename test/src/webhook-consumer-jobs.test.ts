/**
 * End to end on both backends: the service's own webhook consumer turns the stage events its
 * log takes into delivery jobs, exactly one per matching endpoint and event, and none for
 * output or for events appended before the account had endpoints.
 */
import type { NewEvent } from '@svc/core';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { until } from './until.ts';

for (const backend of backends()) {
  t.test(`stage events become one job per matching endpoint on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      // Jobs are counted, not sent; the consumer sweeps often so the test does not wait long.
      env: { WEBHOOK_INTERVAL_MS: '0', WEBHOOK_CONSUMER_SWEEP_MS: '100' },
    });
    const { sql } = svc.db;
    const me = await signUp(svc);
    const tenant = me.accountId;
    const conv = await createConversationRecord(
      sql,
      { accountId: tenant, actor: 'api', ip: null },
      { agentId: 'agt_x' },
    );
    let seq = 0;
    const append = async (events: NewEvent[]) => {
      const r = await svc.appendEvents({ tenant, producer: 'e2e', seq: seq + 1, events });
      seq += events.length;
      t.equal(r.status, 'appended');
      return r.events;
    };
    const stage = (name: string, state: string): NewEvent => ({
      conversationId: conv.id,
      kind: 'stage',
      stream: 'stage',
      stage: name,
      state,
    });
    const output = (data: string): NewEvent => ({ conversationId: conv.id, kind: 'output', stream: 'stdout', data });

    const before = await append([stage('provision', 'started'), output('before any endpoint')]);
    const create = async (eventTypes: string[]) => {
      const res = await svc.http.post('/api/webhooks', {
        token: me.key,
        body: { url: 'https://hooks.example.com/in', event_types: eventTypes },
      });
      t.equal(res.status, 201, res.text);
      return res.body.id as string;
    };
    const turns = await create(['conversation.turn.*']);
    const all = await create(['*']);

    const appended = [];
    for (let i = 0; i < 20; i++) {
      appended.push(
        ...(await append([
          stage('turn', 'started'),
          output(`line ${i}`),
          stage('clone', i % 2 ? 'done' : 'started'),
          output(`more ${i}`),
          stage('turn', i % 3 ? 'done' : 'failed'),
        ])),
      );
    }
    const stages = appended.filter((e) => e.kind === 'stage');
    const expected = [
      ...stages.filter((e) => e.stage === 'turn').map((e) => `${turns} ${e.id}`),
      ...stages.map((e) => `${all} ${e.id}`),
    ].sort();
    const jobs = async () =>
      (
        await sql<{ endpoint_id: string; event_id: string }[]>`
          SELECT endpoint_id, event_id FROM webhook_jobs WHERE account_id = ${tenant}`
      )
        .map((r) => `${r.endpoint_id} ${r.event_id}`)
        .sort();
    await until('a job for every matching event', async () => (await jobs()).length >= expected.length, 30_000);
    // The consumer reads in id order: once a later event has its jobs, every earlier one was handled.
    const [marker] = await append([stage('terminate', 'done')]);
    await until('the job of a later event', async () => (await jobs()).includes(`${all} ${marker?.id}`), 30_000);
    const found = (await jobs()).filter((j) => j !== `${all} ${marker?.id}`);
    t.same(found, expected, 'exactly one job per matching endpoint and stage event, no output, nothing from before');
    t.notOk(
      found.some((j) => before.some((e) => j.endsWith(` ${e.id}`))),
      'the event appended before the account had endpoints has no job',
    );
  });
}
