import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { newId, RUNNER_CLOSE } from '@svc/core';
import { conversations, sandboxes } from '@svc/db';
import t from 'tap';
import { createConversationRecord } from '../../gateway/src/services/conversations.ts';
import { RunnerAgent } from '../../runner-agent/src/agent.ts';
import { backends, signUp, startTestService } from './harness.ts';
import { eventually } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const until = (check: () => boolean | Promise<boolean>, ms = 10_000) => eventually(check, ms);

for (const backend of backends()) {
  t.test(`commands and output over the runner fabric on ${backend}`, async (t) => {
    const svc = await startTestService(t, {
      backend,
      env: { RUNNER_HEARTBEAT_MS: '200', RUNNER_GRACE_MS: '3000', LOG_COPY_INTERVAL_MS: '50' },
    });
    const me = await signUp(svc);
    const { sql } = svc.db;
    const created = await svc.http.post('/api/runners', { token: me.key, body: { name: 'box' } });
    const runnerId = created.body.id as string;
    const root = mkdtempSync(join(tmpdir(), 'svc-fabric-root-'));
    const seen: string[] = [];
    const tracked = new RunnerAgent(
      { url: svc.url, token: created.body.token, root, backoffMs: { first: 50, max: 200 } },
      (e) => seen.push(e.type === 'sandbox' ? `sandbox ${e.state}` : e.type),
    ).start();
    t.teardown(() => tracked.stop());
    t.ok(await until(() => svc.fabric.isLive(runnerId), 30_000), `the runner connected (${seen.join(', ')})`);

    const who = { accountId: me.accountId, actor: 'api' as const, ip: null };
    const conv = await createConversationRecord(sql, who, { agentId: 'agt_x', title: 'on a runner' });
    const sandboxId = newId('sbx');
    await sandboxes.insertSandbox(sql, {
      id: sandboxId,
      accountId: me.accountId,
      provider: 'runner',
      mode: 'ephemeral',
      runnerId,
      agentId: 'agt_x',
      environmentId: null,
      vaultId: null,
    });
    await conversations.setSandbox(sql, me.accountId, conv.id, sandboxId);
    const feed = async () =>
      (await svc.http.get(`/api/conversations/${conv.id}/events?limit=1000`, { token: me.key })).body.data as {
        kind: string;
        stream: string;
        data: string | null;
        stage: string | null;
        state: string | null;
        duration_ms: number | null;
      }[];

    t.test('sandbox.create: acknowledged, built under the root, each stage reported with its output', async (t) => {
      await svc.fabric.command(runnerId, {
        kind: 'sandbox.create',
        sandbox: sandboxId,
        incarnation: 0,
        conversation_id: conv.id,
        env: { GREETING: 'hello from the environment' },
        setup_script: 'echo "setting up in $(basename "$PWD")"; echo "$GREETING"; echo careful >&2',
      });
      t.ok(await until(async () => (await feed()).some((e) => e.stage === 'sandbox' && e.state !== 'started')));
      const events = await feed();
      t.same(
        events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`),
        [
          'provision started',
          'provision done',
          'network started',
          'network done',
          'setup started',
          'setup done',
          'sandbox done',
        ],
        'the runner closes stage sandbox when the build ends',
      );
      const [row] = await sql<{ status: string; built_incarnation: number | null }[]>`
        SELECT status, built_incarnation FROM sandboxes WHERE id = ${sandboxId}`;
      t.same(row, { status: 'ready', built_incarnation: 0 }, 'and the sandbox is ready with that machine');
      t.ok(
        events.filter((e) => e.state === 'done').every((e) => typeof e.duration_ms === 'number'),
        'with durations',
      );
      const stdout = events
        .filter((e) => e.stream === 'stdout')
        .map((e) => e.data)
        .join('');
      t.equal(
        stdout,
        `setting up in ${sandboxId}\nhello from the environment\n`,
        "the script ran in the sandbox's directory with its env",
      );
      t.equal(
        events
          .filter((e) => e.stream === 'stderr')
          .map((e) => e.data)
          .join(''),
        'careful\n',
      );
      t.ok(existsSync(join(root, 'sandboxes', sandboxId)), 'its directory exists under --root');
      t.ok(seen.includes('sandbox ready'));
    });

    t.test('the connection cut mid-output: after the reconnect nothing is lost or doubled', async (t) => {
      const before = (await feed()).length;
      for (let i = 0; i < 300; i++) {
        tracked.emit(sandboxId, 0, { conversation_id: conv.id, kind: 'output', stream: 'stdout', data: `line ${i}\n` });
        if (i === 150) {
          await sleep(0);
          svc.fabric.disconnectHere({ runnerId }, RUNNER_CLOSE.going_away, 'cut mid-output');
        }
        if (i % 50 === 0) await sleep(5);
      }
      t.ok(await until(async () => (await feed()).length >= before + 300));
      await sleep(300);
      const lines = (await feed()).slice(before).map((e) => e.data);
      t.same(
        lines,
        Array.from({ length: 300 }, (_, i) => `line ${i}\n`),
        'every line once, in order',
      );
      t.ok(seen.filter((e) => e === 'connected').length >= 2, 'it reconnected');
      t.ok(await until(() => tracked.keptEvents === 0), 'and forgot everything once the copy held it (durable)');
    });

    t.test('a failing setup script fails its stage, visibly', async (t) => {
      const other = newId('sbx');
      await sandboxes.insertSandbox(sql, {
        id: other,
        accountId: me.accountId,
        provider: 'runner',
        mode: 'ephemeral',
        runnerId,
        agentId: 'agt_x',
        environmentId: null,
        vaultId: null,
      });
      const conv2 = await createConversationRecord(sql, who, { agentId: 'agt_x', title: 'fails' });
      await conversations.setSandbox(sql, me.accountId, conv2.id, other);
      await svc.fabric.command(runnerId, {
        kind: 'sandbox.create',
        sandbox: other,
        incarnation: 0,
        conversation_id: conv2.id,
        env: {},
        setup_script: 'echo about to fail; exit 3',
      });
      const stageOf = async () =>
        (
          (await svc.http.get(`/api/conversations/${conv2.id}/events`, { token: me.key })).body.data as {
            stage: string | null;
            state: string | null;
            data: string | null;
          }[]
        ).filter((e) => e.stage === 'setup');
      t.ok(await until(async () => (await stageOf()).length === 2));
      t.match((await stageOf())[1], { state: 'failed', data: 'the setup script exited with 3' });
      t.ok(seen.includes('sandbox failed'));
    });

    t.test('output for a sandbox that is not on this runner is discarded, and the runner stays', async (t) => {
      const before = seen.filter((e) => e === 'connected').length;
      tracked.emit('sbx_not_mine', 0, { conversation_id: conv.id, kind: 'output', stream: 'stdout', data: 'x' });
      t.ok(await until(() => seen.includes('output_discarded'), 15_000), `told to discard it (${seen.join(', ')})`);
      // Kept events are counted over every sandbox: the earlier tests' output leaves once the
      // copy holds it, which a loaded machine may take a moment for.
      t.ok(
        await until(() => tracked.keptEvents === 0, 15_000),
        `nothing of it is kept (${tracked.keptEvents} events kept)`,
      );
      await svc.fabric.command(runnerId, { kind: 'sandbox.destroy', sandbox: sandboxId, incarnation: 0 });
      t.ok(svc.fabric.isLive(runnerId), 'the same connection still takes commands');
      t.equal(seen.filter((e) => e === 'connected').length, before, 'it did not have to reconnect');
    });
  });
}
