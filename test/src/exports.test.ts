import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { exports as exportRows, logEvents } from '@svc/db';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { buildExport, EXPORT_MAX_ATTEMPTS, ExportFiles } from '../../gateway/src/services/exports.ts';
import { ExportBuilder } from '../../gateway/src/workers/export-builder.ts';
import { backends, signUp, startTestService, type TestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { until } from './until.ts';

const INFERENCE_KEY = 'sk-ant-test-credential-123456';
const VAULT_SECRET = 'vault-secret-value-9f8e7d6c';
const ENV_SECRET = 'postgres://app:env-secret-4b3a2918@db/app';
const LEASE_MS = 2 * 60_000;
const HOUR_MS = 60 * 60_000;

interface ExportFile {
  format: string;
  version: number;
  account_id: string;
  [section: string]: unknown;
  events: { id: number; kind: string; stream: string; data: string | null; conversation_id: string | null }[];
}

/** The export worker as the service runs it, driven by the test (`pass()`) on a given clock. */
function builder(svc: TestService, now: () => Date = () => new Date()) {
  return new ExportBuilder(
    { sql: svc.db.sql, log: svc.eventLog, files: new ExportFiles(svc.dataDir), logger: svc.log, now },
    { periodMs: 0, leaseMs: LEASE_MS },
  );
}

/** Downloads export `id` as bytes (the client helper reads text). */
async function download(svc: TestService, token: string, id: string) {
  const res = await fetch(`${svc.url}/api/account/exports/${id}/download`, {
    headers: { authorization: `Bearer ${token}` },
  });
  return { status: res.status, headers: res.headers, bytes: Buffer.from(await res.arrayBuffer()) };
}

/** Moves the account's exports back in time, as if they had been requested `ms` earlier. */
async function age(svc: TestService, accountId: string, ms: number) {
  await svc.db.sql`UPDATE exports SET created_at = created_at - ${`${ms} milliseconds`}::interval
                   WHERE account_id = ${accountId}`;
}

for (const backend of backends()) {
  t.test(`account exports on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: { EXPORT_WORKER_INTERVAL_MS: '0', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
    });
    const { http } = svc;

    t.test('the file holds every resource and a real conversation’s events, and no secret value', async (t) => {
      const me = await signUp(svc);
      const token = me.key;
      const { env, agent } = await claudeAgent(t, http, token);
      const envSecret = await http.post(`/api/environments/${env.id}/secrets`, {
        token,
        body: { key: 'DATABASE_URL', value: ENV_SECRET },
      });
      t.equal(envSecret.status, 201, envSecret.text);
      const vault = await http.post('/api/vaults', { token, body: { name: 'prod' } });
      const secret = await http.post(`/api/vaults/${vault.body.id}/secrets`, {
        token,
        body: { key: 'API_TOKEN', value: VAULT_SECRET },
      });
      t.equal(secret.status, 201, secret.text);
      const hook = await http.post('/api/webhooks', { token, body: { url: 'https://hooks.example.com/svc' } });
      const report = await http.post('/api/support/reports', {
        token,
        body: { category: 'bug', message: 'export me' },
      });
      t.equal(report.status, 201, report.text);
      t.equal(hook.status, 201, hook.text);
      const webhookSecret = hook.body.secret as string;
      const started = await http.post('/api/conversations', {
        token,
        body: { agent_id: agent.id, prompt: 'hello export' },
      });
      t.equal(started.status, 201, started.text);
      const conversationId = started.body.id as string;
      await until(
        'the turn to end',
        async () =>
          (await http.get(`/api/conversations/${conversationId}/turns`, { token })).body.data[0]?.state === 'done',
        60_000,
      );
      const logged = (await http.get(`/api/conversations/${conversationId}/events?limit=1000`, { token })).body
        .data as { id: number }[];
      t.ok(logged.length > 0, 'the conversation has events');

      const requested = await http.post('/api/account/exports', { token });
      t.equal(requested.status, 202, requested.text);
      t.match(requested.body, {
        id: /^exp_/,
        status: 'pending',
        downloadable: false,
        progress: { events_written: 0 },
        bytes: null,
        download_url: null,
      });
      const id = requested.body.id as string;
      const early = await http.get(`/api/account/exports/${id}/download`, { token });
      t.equal(early.status, 404, 'not downloadable before it is built');
      t.same(early.body, { error: 'not_found', message: 'The export is not downloadable yet.' });

      t.equal(await builder(svc).pass(), 1, 'the worker built it');
      const ready = await http.get(`/api/account/exports/${id}`, { token });
      t.match(ready.body, {
        id,
        status: 'ready',
        downloadable: true,
        download_url: `/api/account/exports/${id}/download`,
      });
      const list = await http.get('/api/account/exports', { token });
      t.same(list.body, { data: [ready.body] }, 'the list is the latest export');

      const file = await download(svc, token, id);
      t.equal(file.status, 200);
      t.equal(file.headers.get('content-type'), 'application/gzip');
      t.equal(file.bytes.length, ready.body.bytes, 'the size shown is the size served');
      const raw = gunzipSync(file.bytes);
      const doc = JSON.parse(raw.toString('utf8')) as ExportFile;
      t.match(doc, { format: 'svc-export', version: 1, account_id: me.accountId });
      t.match(doc.agents, [{ id: agent.id, name: 'coder' }]);
      t.match(doc.environments, [{ id: env.id, name: 'main' }]);
      t.match(doc.environment_secrets, [{ environment_id: env.id, key: 'DATABASE_URL' }]);
      t.match(doc.vaults, [{ id: vault.body.id, name: 'prod' }]);
      t.match(doc.vault_secrets, [{ vault_id: vault.body.id, key: 'API_TOKEN' }]);
      t.match(doc.conversations, [{ id: conversationId }]);
      t.match(doc.turns, [{ conversation_id: conversationId, prompt: 'hello export', state: 'done' }]);
      t.match(doc.webhooks, [{ id: hook.body.id, url: 'https://hooks.example.com/svc' }]);
      t.same(doc.schedules, []);
      t.same(doc.teammates, []);
      t.same(doc.credit_ledger, [], 'the credit ledger (empty with payment off)');
      t.match(doc.support_reports, [{ id: report.body.id, category: 'bug', message: 'export me' }]);
      t.notOk('screenshot' in ((doc.support_reports as object[])[0] ?? {}), 'no screenshot bytes');
      t.ok(
        (doc.audit as { action: string }[]).some((a) => a.action === 'account.export_requested'),
        'the audit trail is in it',
      );
      const fromConversation = doc.events.filter((e) => e.conversation_id === conversationId).map((e) => e.id);
      t.same(
        fromConversation,
        logged.map((e) => e.id),
        'every event of the conversation, in order',
      );
      t.ok(
        doc.events.some((e) => e.conversation_id === conversationId && e.data?.includes('hello export')),
        'the reply’s output is in the log',
      );
      for (const [what, value] of [
        ['inference credential', INFERENCE_KEY],
        ['vault secret', VAULT_SECRET],
        ['environment secret', ENV_SECRET],
        ['webhook secret', webhookSecret],
      ] as const) {
        t.notOk(raw.includes(value), `no ${what} in the file`);
      }
      t.notOk(raw.includes('ciphertext'), 'no encrypted column either');
    });

    t.test('a second request within the hour is 429 with Retry-After; one export at a time', async (t) => {
      const me = await signUp(svc);
      const token = me.key;
      const first = await http.post('/api/account/exports', { token });
      t.equal(first.status, 202);
      const again = await http.post('/api/account/exports', { token });
      t.equal(again.status, 429);
      t.same(again.body, { error: 'rate_limited', message: 'An export can be requested once an hour.' });
      const retry = Number(again.headers.get('retry-after'));
      t.ok(retry > 3500 && retry <= 3600, `Retry-After counts down the hour (${retry})`);

      // An hour on, the first is still being built: still one at a time.
      await age(svc, me.accountId, HOUR_MS + 1000);
      const busy = await http.post('/api/account/exports', { token });
      t.equal(busy.status, 429);
      t.same(busy.body, { error: 'rate_limited', message: 'An export is already being built; one at a time.' });
      t.ok(Number(busy.headers.get('retry-after')) > 0, 'with Retry-After');

      await builder(svc).pass();
      const next = await http.post('/api/account/exports', { token });
      t.equal(next.status, 202, 'once built and an hour on, a new one starts');
      const list = await http.get('/api/account/exports', { token });
      t.same(
        list.body.data.map((e: { id: string; status: string }) => [e.id, e.status]),
        [[next.body.id, 'pending']],
        'the list shows the latest only',
      );
      await builder(svc).pass();
    });

    t.test('a newer export replaces the older one and deletes its file', async (t) => {
      const me = await signUp(svc);
      const token = me.key;
      const files = new ExportFiles(svc.dataDir);
      const first = (await http.post('/api/account/exports', { token })).body.id as string;
      await builder(svc).pass();
      t.ok(existsSync(files.fileOf(me.accountId, first)));
      await age(svc, me.accountId, HOUR_MS + 1000);
      const second = (await http.post('/api/account/exports', { token })).body.id as string;
      t.equal((await download(svc, token, first)).status, 200, 'the older stays downloadable while the newer builds');
      await builder(svc).pass();
      t.notOk(existsSync(files.fileOf(me.accountId, first)), 'the older file is gone');
      t.equal((await http.get(`/api/account/exports/${first}`, { token })).status, 404);
      t.same(await readdir(files.dirOf(me.accountId)), [`${second}.json.gz`]);
    });

    t.test('a standard-scope key can neither request, read nor download an export: 403', async (t) => {
      const me = await signUp(svc);
      const std = (await http.post('/api/auth/api-keys', { token: me.key, body: { scope: 'standard' } })).body
        .key as string;
      const id = (await http.post('/api/account/exports', { token: me.key })).body.id as string;
      await builder(svc).pass();
      const refused = { error: 'forbidden', message: 'This route needs a full-scope key.' };
      for (const [method, path] of [
        ['POST', '/api/account/exports'],
        ['GET', '/api/account/exports'],
        ['GET', `/api/account/exports/${id}`],
        ['GET', `/api/account/exports/${id}/download`],
      ] as const) {
        const res = await http.call(method, path, { token: std });
        t.equal(res.status, 403, `${method} ${path}`);
        t.same(res.body, refused);
      }
    });

    t.test('another tenant’s export is 404 on every route', async (t) => {
      const me = await signUp(svc);
      const other = await signUp(svc);
      const id = (await http.post('/api/account/exports', { token: me.key })).body.id as string;
      await builder(svc).pass();
      t.equal((await download(svc, me.key, id)).status, 200, 'its owner downloads it');
      const get = await http.get(`/api/account/exports/${id}`, { token: other.key });
      t.equal(get.status, 404);
      t.same(get.body, { error: 'not_found', message: 'No such export.' });
      const file = await http.get(`/api/account/exports/${id}/download`, { token: other.key });
      t.equal(file.status, 404);
      t.same(file.body, { error: 'not_found', message: 'No such export.' });
      t.same((await http.get('/api/account/exports', { token: other.key })).body, { data: [] });
    });

    t.test('a deleted conversation’s events stay out of the export, though the hot log still holds them', async (t) => {
      const me = await signUp(svc);
      const token = me.key;
      const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
      const kept = await createConversationRecord(svc.db.sql, who, { agentId: 'agt_x', title: 'kept' });
      const gone = await createConversationRecord(svc.db.sql, who, { agentId: 'agt_x', title: 'gone' });
      // More than a page (1,000) of the kept one first, so the deleted one's events fall in a
      // later page, one the hot log could answer.
      let seq = 0;
      const lines = (conv: { id: string; title: string }, n: number) =>
        Array.from({ length: n }, (_, i) => ({
          conversationId: conv.id,
          kind: 'output',
          stream: 'stdout',
          data: `${conv.title} ${i}`,
        }));
      for (const events of [lines(kept, 500), lines(kept, 500), lines(gone, 20), lines(kept, 20)]) {
        await svc.appendEvents({ tenant: me.accountId, producer: 'p', seq: seq + 1, events });
        seq += events.length;
      }
      const last = await svc.eventLog.lastId(me.accountId);
      await until(
        'the events to be copied',
        async () => (await logEvents.copiedUpTo(svc.db.sql, me.accountId)) >= last,
      );
      t.equal((await http.delete(`/api/conversations/${gone.id}`, { token })).status, 204);
      const hot = await svc.eventLog.read(me.accountId, { after: 0, limit: 5000 });
      t.ok(
        hot.some((e) => e.conversationId === gone.id),
        'the hot log still holds the deleted one’s events',
      );
      const id = (await http.post('/api/account/exports', { token })).body.id as string;
      t.equal(await builder(svc).pass(), 1);
      const doc = JSON.parse(gunzipSync((await download(svc, token, id)).bytes).toString('utf8')) as ExportFile;
      const data = doc.events.filter((e) => e.kind === 'output').map((e) => e.data);
      t.equal(data.length, 1020, 'the kept conversation’s events, all of them');
      t.ok(
        data.every((d) => d?.startsWith('kept ')),
        'and none of the deleted one',
      );
    });

    t.test('a worker killed mid-build leaves a pending export that the next worker builds whole', async (t) => {
      const me = await signUp(svc);
      const token = me.key;
      const events = Array.from({ length: 2500 }, (_, i) => ({
        conversationId: null,
        kind: 'output',
        stream: 'stdout',
        data: `line ${i}`,
      }));
      for (let i = 0; i < events.length; i += 500) {
        await svc.appendEvents({
          tenant: me.accountId,
          producer: 'bulk',
          seq: i + 1,
          events: events.slice(i, i + 500),
        });
      }
      const id = (await http.post('/api/account/exports', { token })).body.id as string;
      // The first worker "dies" once it has written two pages of events: its second progress
      // write never answers (whichever of Postgres or the hot log the pages came from).
      let progressWrites = 0;
      const dying = new Proxy(svc.db.sql, {
        apply(target, self, args) {
          const strings: unknown = args[0];
          if (Array.isArray(strings) && strings.join('').includes('SET events_written') && ++progressWrites > 1) {
            return new Promise<never>(() => {});
          }
          return Reflect.apply(target, self, args);
        },
      });
      const files = new ExportFiles(svc.dataDir);
      const claimed = await exportRows.claimPending(svc.db.sql, new Date(), new Date(Date.now() + LEASE_MS));
      t.equal(claimed?.id, id);
      void buildExport(
        { sql: dying, log: svc.eventLog, files, logger: svc.log, now: () => new Date() },
        claimed as exportRows.ExportRow,
        LEASE_MS,
      );
      const building = await until('progress to show', async () => {
        const e = (await http.get(`/api/account/exports/${id}`, { token })).body;
        return e.progress.events_written > 0 && e;
      });
      t.match(building, { status: 'pending', downloadable: false, progress: { events_written: 1000 } });
      t.same(await readdir(files.dirOf(me.accountId)), [`${id}.1.part`], 'only a part file exists');
      t.equal((await download(svc, token, id)).status, 404, 'a half file is never downloadable');
      t.equal(await builder(svc).pass(), 0, 'no other worker takes it while its lease holds');

      // Once the lease has passed, the next worker builds it again, whole.
      const later = () => new Date(Date.now() + LEASE_MS + 60_000);
      t.equal(await builder(svc, later).pass(), 1);
      const ready = (await http.get(`/api/account/exports/${id}`, { token })).body;
      t.match(ready, { status: 'ready', downloadable: true, progress: { events_written: 2500 } });
      t.same(await readdir(files.dirOf(me.accountId)), [`${id}.json.gz`], 'the dead worker’s part is gone');
      const doc = JSON.parse(gunzipSync((await download(svc, token, id)).bytes).toString('utf8')) as ExportFile;
      t.same(
        doc.events.map((e) => e.data),
        events.map((e) => e.data),
      );
    });

    t.test(
      'an export whose build keeps failing ends failed after five attempts, and a new one may follow',
      async (t) => {
        const me = await signUp(svc);
        const token = me.key;
        const files = new ExportFiles(svc.dataDir);
        // A file where the account's export folder belongs: every build fails to start its file.
        await mkdir(join(svc.dataDir, 'exports'), { recursive: true });
        await writeFile(files.dirOf(me.accountId), 'in the way');
        const id = (await http.post('/api/account/exports', { token })).body.id as string;
        for (let attempt = 1; attempt < EXPORT_MAX_ATTEMPTS; attempt++) {
          t.equal(await builder(svc).pass(), 0, `attempt ${attempt} fails`);
          t.match((await http.get(`/api/account/exports/${id}`, { token })).body, { status: 'pending' });
        }
        await builder(svc).pass();
        const failed = await http.get(`/api/account/exports/${id}`, { token });
        t.match(failed.body, { id, status: 'failed', downloadable: false, download_url: null });
        t.equal((await http.get(`/api/account/exports/${id}/download`, { token })).status, 404);
        await rm(files.dirOf(me.accountId));
        await age(svc, me.accountId, HOUR_MS + 1000);
        const next = await http.post('/api/account/exports', { token });
        t.equal(next.status, 202, 'a failed export does not hold the next one back');
        t.equal(await builder(svc).pass(), 1);
      },
    );

    t.test('deleting the account removes its export files', async (t) => {
      const me = await signUp(svc);
      const token = me.key;
      const id = (await http.post('/api/account/exports', { token })).body.id as string;
      await builder(svc).pass();
      const files = new ExportFiles(svc.dataDir);
      const path = files.fileOf(me.accountId, id);
      t.ok((await readFile(path)).length > 0, 'the file is there');
      const gone = await http.delete('/api/account', { token, body: { confirm: me.email } });
      t.equal(gone.status, 204, gone.text);
      t.notOk(existsSync(path), 'the file is gone');
      t.notOk(existsSync(join(svc.dataDir, 'exports', me.accountId)), 'and the account’s folder');
    });
  });
}
