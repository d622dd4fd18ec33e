import { mkdtempSync, readdirSync, readFileSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { newId, RUNNER_CLOSE, type RunnerEvent } from '@svc/core';
import { conversations, sandboxes } from '@svc/db';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { type AgentEvent, RunnerAgent, spoolDir } from '../../runner-agent/src/agent.ts';
import { OutputLog } from '../../runner-agent/src/output.ts';
import { RECORD_HEADER_BYTES } from '../../runner-agent/src/spool.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { startRunnerProcess } from './runner-process.ts';
import { eventually } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = (check: () => boolean | Promise<boolean>, ms = 20_000) => eventually(check, ms, 50);

const MEMORY = { bytes: 4096, events: 1000 };
const line = (tag: string, i: number): RunnerEvent => ({
  conversation_id: '',
  kind: 'output',
  stream: 'stdout',
  data: `${tag} ${i} ${'-'.repeat(40)}\n`,
});
const lines = (tag: string, from: number, to: number) =>
  Array.from({ length: to - from + 1 }, (_, i) => line(tag, from + i).data);

/** Offsets where each record of a segment file starts, and where the file ends. */
function recordStarts(path: string): number[] {
  const bytes = readFileSync(path);
  const starts: number[] = [];
  for (let at = 0; at < bytes.length; at += RECORD_HEADER_BYTES + bytes.readUInt32BE(at + 8)) starts.push(at);
  return [...starts, bytes.length];
}

for (const backend of backends()) {
  t.test(`output kept past the memory bound, on disk, across reconnects and restarts, on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: { RUNNER_HEARTBEAT_MS: '200', RUNNER_GRACE_MS: '30000', LOG_COPY_INTERVAL_MS: '50' },
    });
    const me = await signUp(svc);
    const { sql } = svc.db;
    const created = await svc.http.post('/api/runners', { token: me.key, body: { name: 'spilling box' } });
    const runnerId = created.body.id as string;
    const token = created.body.token as string;
    const who = { accountId: me.accountId, actor: 'api' as const, ip: null };

    /** A sandbox on the runner with one conversation on it. */
    async function sandboxWithConversation() {
      const conv = await createConversationRecord(sql, who, { agentId: 'agt_x', title: 'spills' });
      const id = newId('sbx');
      await sandboxes.insertSandbox(sql, {
        id,
        accountId: me.accountId,
        provider: 'runner',
        mode: 'ephemeral',
        runnerId,
        agentId: 'agt_x',
        environmentId: null,
        vaultId: null,
      });
      await conversations.setSandbox(sql, me.accountId, conv.id, id);
      return { sandbox: id, conversation: conv.id };
    }

    /** The conversation's output as the JSON feed gives it, every page. */
    async function feed(conversation: string): Promise<(string | null)[]> {
      const out: (string | null)[] = [];
      let after: string | undefined;
      for (;;) {
        const page = await svc.http.get(
          `/api/conversations/${conversation}/events?limit=1000${after ? `&after=${after}` : ''}`,
          { token: me.key },
        );
        const body = page.body as { data: { kind: string; data: string | null }[]; meta: Record<string, unknown> };
        out.push(...body.data.filter((e) => e.kind === 'output').map((e) => e.data));
        if (!body.meta.has_more) return out;
        after = body.meta.next_cursor as string;
      }
    }

    /** An in-process runner-agent under `root`; `backoff` long keeps it away once cut off. */
    async function agent(root: string, backoff = { first: 50, max: 200 }) {
      const seen: AgentEvent[] = [];
      const a = new RunnerAgent({ url: svc.url, token, root, backoffMs: backoff, outputMemory: MEMORY }, (e) =>
        seen.push(e),
      ).start();
      t.teardown(() => a.stop());
      const connected = () => seen.filter((e) => e.type === 'connected').length;
      if (!(await until(() => connected() > 0))) throw new Error(`no connection: ${JSON.stringify(seen)}`);
      return { agent: a, seen, connected };
    }

    /** Cuts the runner off; with a long backoff it stays away until stopped. */
    async function cutOff(seen: AgentEvent[]) {
      const before = seen.filter((e) => e.type === 'disconnected').length;
      svc.fabric.disconnectHere({ runnerId }, RUNNER_CLOSE.going_away, 'cut off for the test');
      await until(() => seen.filter((e) => e.type === 'disconnected').length > before);
    }

    /** Stops an agent and waits until its spool files are closed. */
    async function stopped(a: RunnerAgent) {
      a.stop();
      await a.done;
      await sleep(50);
    }

    const spoolFiles = (root: string) =>
      readdirSync(spoolDir(root, token))
        .sort()
        .map((f) => ({ name: f, bytes: statSync(join(spoolDir(root, token), f)).size }));

    t.test(
      'while the service is away output keeps coming, memory stays bounded, and it all arrives once',
      async (t) => {
        const root = mkdtempSync(join(tmpdir(), 'svc-spill-'));
        const { agent: a, seen, connected } = await agent(root, { first: 1500, max: 1500 });
        const { sandbox, conversation } = await sandboxWithConversation();
        for (let i = 1; i <= 200; i++) a.emit(sandbox, 0, { ...line('before', i), conversation_id: conversation });
        t.ok(await until(async () => (await feed(conversation)).length === 200), 'sent while connected');

        await cutOff(seen);
        const peak = { bytes: 0, events: 0 };
        for (let i = 1; i <= 3000; i++) {
          a.emit(sandbox, 0, { ...line('away', i), conversation_id: conversation });
          peak.bytes = Math.max(peak.bytes, a.outputInMemory.bytes);
          peak.events = Math.max(peak.events, a.outputInMemory.events);
          if (i % 500 === 0) await sleep(1);
        }
        t.ok(peak.bytes <= MEMORY.bytes, `memory held at most ${MEMORY.bytes} bytes while away (peak ${peak.bytes})`);
        t.ok(peak.events < 100, `and a few dozen events, not thousands (peak ${peak.events})`);
        t.ok(a.keptEvents >= 3000, `everything not durable is kept (${a.keptEvents}), on disk`);
        t.ok(spoolFiles(root).reduce((n, f) => n + f.bytes, 0) > 3000 * 40, 'the spool holds what memory does not');

        t.ok(
          await until(async () => (await feed(conversation)).length >= 3200, 30_000),
          'after the reconnect it arrives',
        );
        t.ok(connected() >= 2, 'it reconnected');
        await sleep(500);
        t.same(
          await feed(conversation),
          [...lines('before', 1, 200), ...lines('away', 1, 3000)],
          'every line once, in order',
        );
        t.ok(await until(() => a.keptEvents === 0), 'all durable, all forgotten');
        t.ok(
          await until(() => spoolFiles(root).every((f) => f.bytes === 0)),
          `durable output is removed from disk (${JSON.stringify(spoolFiles(root))})`,
        );
        await stopped(a);
      },
    );

    t.test(
      'a restarted runner sends what it spooled; the log has every event once and numbering goes on',
      async (t) => {
        const root = mkdtempSync(join(tmpdir(), 'svc-spill-'));
        const first = await agent(root, { first: 60_000, max: 60_000 });
        const { sandbox, conversation } = await sandboxWithConversation();
        for (let i = 1; i <= 100; i++)
          first.agent.emit(sandbox, 0, { ...line('sent', i), conversation_id: conversation });
        t.ok(await until(async () => (await feed(conversation)).length === 100));
        await cutOff(first.seen);
        for (let i = 1; i <= 1500; i++)
          first.agent.emit(sandbox, 0, { ...line('held', i), conversation_id: conversation });
        await stopped(first.agent);
        t.equal((await feed(conversation)).length, 100, 'nothing of it reached the service before the restart');

        const second = await agent(root);
        t.match(
          second.seen.find((e) => e.type === 'recovered'),
          { type: 'recovered', incarnations: 1, cutBytes: 0 },
        );
        t.ok(await until(async () => (await feed(conversation)).length >= 1600));
        second.agent.emit(sandbox, 0, { ...line('after', 1), conversation_id: conversation });
        t.ok(await until(async () => (await feed(conversation)).length >= 1601), 'numbered after the recovered tail');
        await sleep(300);
        t.same(await feed(conversation), [
          ...lines('sent', 1, 100),
          ...lines('held', 1, 1500),
          ...lines('after', 1, 1),
        ]);
        t.ok(await until(() => spoolFiles(root).every((f) => f.bytes === 0)), 'then removed from disk');
        await stopped(second.agent);
      },
    );

    /** Spools `n` lines of a fresh sandbox while cut off, stops, damages the spool, restarts; returns the feed. */
    async function damagedRestart(n: number, damage: (path: string) => void) {
      const root = mkdtempSync(join(tmpdir(), 'svc-spill-'));
      const first = await agent(root, { first: 60_000, max: 60_000 });
      const { sandbox, conversation } = await sandboxWithConversation();
      await cutOff(first.seen);
      for (let i = 1; i <= n; i++) first.agent.emit(sandbox, 0, { ...line('held', i), conversation_id: conversation });
      await stopped(first.agent);
      const files = readdirSync(spoolDir(root, token)).filter((f) => f.startsWith(`${sandbox}.0.`));
      if (files.length !== 1) throw new Error(`expected one segment, found ${files.join(', ')}`);
      damage(join(spoolDir(root, token), files[0] as string));
      const second = await agent(root);
      return { second, sandbox, conversation };
    }

    t.test('a record torn at the end of the spool: only the whole records before it are sent', async (t) => {
      const { second, sandbox, conversation } = await damagedRestart(50, (path) => {
        const starts = recordStarts(path);
        truncateSync(path, (starts[40] as number) + 7);
      });
      t.match(
        second.seen.find((e) => e.type === 'recovered'),
        { events: 40, cutBytes: 7 },
      );
      t.ok(await until(async () => (await feed(conversation)).length >= 40));
      second.agent.emit(sandbox, 0, { ...line('after', 1), conversation_id: conversation });
      t.ok(await until(async () => (await feed(conversation)).length >= 41));
      await sleep(300);
      t.same(await feed(conversation), [...lines('held', 1, 40), ...lines('after', 1, 1)]);
      await stopped(second.agent);
    });

    t.test('a damaged byte in a payload: the records from it on are not sent', async (t) => {
      const { second, sandbox, conversation } = await damagedRestart(50, (path) => {
        const starts = recordStarts(path);
        const bytes = readFileSync(path);
        const at = (starts[25] as number) + RECORD_HEADER_BYTES + 12;
        bytes[at] = (bytes[at] as number) ^ 0x01;
        writeFileSync(path, bytes);
      });
      t.match(
        second.seen.find((e) => e.type === 'recovered'),
        { events: 25 },
      );
      t.ok(await until(async () => (await feed(conversation)).length >= 25));
      second.agent.emit(sandbox, 0, { ...line('after', 1), conversation_id: conversation });
      t.ok(await until(async () => (await feed(conversation)).length >= 26));
      await sleep(300);
      t.same(await feed(conversation), [...lines('held', 1, 25), ...lines('after', 1, 1)]);
      await stopped(second.agent);
    });

    t.test('runners sharing a root (as the local runner-agents do) never take up each other’s spool', async (t) => {
      const root = mkdtempSync(join(tmpdir(), 'svc-spill-'));
      const first = await agent(root, { first: 60_000, max: 60_000 });
      const { sandbox, conversation } = await sandboxWithConversation();
      await cutOff(first.seen);
      for (let i = 1; i <= 20; i++) first.agent.emit(sandbox, 0, { ...line('held', i), conversation_id: conversation });
      await stopped(first.agent);
      const otherRunner = await svc.http.post('/api/runners', { token: me.key, body: { name: 'neighbour' } });
      const seen: AgentEvent[] = [];
      const other = new RunnerAgent(
        { url: svc.url, token: otherRunner.body.token, root, backoffMs: { first: 50, max: 200 } },
        (e) => seen.push(e),
      ).start();
      t.teardown(() => other.stop());
      t.ok(await until(() => seen.some((e) => e.type === 'connected')));
      await sleep(500);
      t.notOk(
        seen.some((e) => e.type === 'recovered' || e.type === 'stopped'),
        `it neither resends the other runner's output nor is refused for it (${seen.map((e) => e.type).join(', ')})`,
      );
      t.equal(other.keptEvents, 0);
      t.equal(spoolFiles(root).length, 1, "the other runner's spool is left as it was");
      other.stop();
    });

    t.test('a new svc-runner process with the same --root sends what the last one spooled', async (t) => {
      const root = mkdtempSync(join(tmpdir(), 'svc-spill-'));
      const first = await agent(root, { first: 60_000, max: 60_000 });
      const { sandbox, conversation } = await sandboxWithConversation();
      await cutOff(first.seen);
      for (let i = 1; i <= 800; i++)
        first.agent.emit(sandbox, 0, { ...line('held', i), conversation_id: conversation });
      await stopped(first.agent);

      const runner = await startRunnerProcess(t, svc.url, token, ['--output-memory-mb', '0.01'], { root });
      t.match(runner.output, /800 events of 1 sandbox incarnation\(s\) kept from before a restart/);
      t.ok(await until(async () => (await feed(conversation)).length >= 800));
      // A turn for the sandbox this process never built fails visibly: its events are numbered
      // after the recovered ones, or the log would drop them as already held.
      await svc.fabric.command(runnerId, {
        kind: 'turn.start',
        sandbox,
        incarnation: 0,
        conversation_id: conversation,
        turn_id: newId('trn'),
        prompt: 'hello',
        runtime: { command: 'true', args: [], env: {} },
        time_limit_ms: 5000,
      });
      const stages = async () =>
        (
          (await svc.http.get(`/api/conversations/${conversation}/events?limit=1000`, { token: me.key })).body as {
            data: { stage: string | null; state: string | null }[];
          }
        ).data.filter((e) => e.stage === 'turn');
      t.ok(await until(async () => (await stages()).length === 2), 'the turn’s events arrive');
      t.match((await stages())[1], { state: 'failed' });
      await sleep(300);
      t.same(await feed(conversation), lines('held', 1, 800), 'every spooled line once, in order');
      t.ok(await until(() => spoolFiles(root).every((f) => f.bytes === 0)), 'durable output is removed from disk');
      runner.child.kill('SIGTERM');
      t.equal(await new Promise((r) => runner.child.on('exit', r)), 0);
    });

    t.test('kept output of a sandbox the service no longer has is discarded, once, and svc-runner stays', async (t) => {
      const root = mkdtempSync(join(tmpdir(), 'svc-spill-'));
      const { conversation } = await sandboxWithConversation();
      const gone = new OutputLog('sbx_gone_elsewhere', 0, { dir: spoolDir(root, token) });
      gone.push({ ...line('lost', 1), conversation_id: conversation });
      gone.push({ ...line('lost', 2), conversation_id: conversation });
      gone.close();
      t.ok(
        spoolFiles(root).some((f) => f.bytes > 0),
        'the spool holds it before the start',
      );
      const first = await startRunnerProcess(t, svc.url, token, [], { root });
      t.ok(
        await until(() => /2 kept events of sandbox sbx_gone_elsewhere discarded/.test(first.output), 30_000),
        `it says what it discarded and why (${first.output})`,
      );
      t.match(first.output, /is not on this runner/);
      t.same(
        spoolFiles(root).filter((f) => f.name.includes('sbx_gone_elsewhere')),
        [],
        'its spool files are removed',
      );
      t.equal(first.child.exitCode, null, 'svc-runner keeps running');
      first.child.kill('SIGTERM');
      t.equal(await new Promise((r) => first.child.on('exit', r)), 0);
      const second = await startRunnerProcess(t, svc.url, token, [], { root });
      t.match(second.output, /connected as runner/, 'a restart connects');
      await sleep(500);
      t.notMatch(second.output, /discarded/, 'and has nothing left to discard');
      second.child.kill('SIGTERM');
      t.equal(await new Promise((r) => second.child.on('exit', r)), 0);
    });
  });
}
