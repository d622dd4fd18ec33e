/**
 * `systemctl restart svc-runner`: a runner stopped with SIGTERM and started again with the same
 * token and `--root` keeps its conversations. The sandboxes it finds under its root are woken
 * on the next prompt (stage `reattach`, a fresh runtime session, the disk as it was); one whose
 * directory is gone is shown `failed` at once, and its conversation says what happens next.
 */
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import { ranIn, replyOf, run64, turnSettled } from './scripted-turns.ts';
import type { WireEvent } from './sse-client.ts';
import { until } from './until.ts';

t.test('a runner restarted with the same token and root keeps its conversations', async (t) => {
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
  });
  const { http } = svc;
  const { key: token } = await signUp(svc);
  const { agent, runnerRow, runner } = await claudeOnRunner(t, svc, token);
  const launch = async () => {
    const res = await http.post('/api/conversations', {
      token,
      body: { agent_id: agent.id, prompt: run64(['echo on-disk > kept.txt']) },
    });
    t.equal(res.status, 201, res.text);
    t.equal(await turnSettled(http, token, res.body.id), 'done');
    const sandboxId = (await http.get(`/api/conversations/${res.body.id}`, { token })).body.sandbox_id as string;
    return { id: res.body.id as string, sandboxId, dir: join(runner.root, 'sandboxes', sandboxId) };
  };
  const kept = await launch();
  const lost = await launch();
  const ended = await launch();
  t.ok(existsSync(kept.dir) && existsSync(lost.dir) && existsSync(ended.dir), 'the sandboxes are on the runner’s disk');

  // The restart: SIGTERM, then one directory removed and one conversation ended while it is
  // down, then a start.
  runner.child.kill('SIGTERM');
  await new Promise((resolve) => runner.child.once('exit', resolve));
  rmSync(lost.dir, { recursive: true, force: true });
  const terminated = await http.post(`/api/conversations/${ended.id}/terminate`, { token });
  t.equal(terminated.status, 200, terminated.text);
  t.ok(existsSync(ended.dir), 'a sandbox terminated while its runner is down keeps its directory for now');
  const again = await startRunnerProcess(t, svc.url, runnerRow.token, [], { root: runner.root });
  t.match(again.output, /connected as runner/);
  t.ok(
    await until('the terminated sandbox’s directory to go', () => !existsSync(ended.dir)),
    'and loses it once the runner is back',
  );

  const sandbox = (id: string) => http.get(`/api/sandboxes/${id}`, { token }).then((r) => r.body);
  t.equal(
    await until(
      'the lost sandbox to be failed',
      async () => (await sandbox(lost.sandboxId)).status === 'failed' || undefined,
    ),
    true,
    'the sandbox whose directory is gone is failed at once',
  );
  const lostEvents = (await http.get(`/api/conversations/${lost.id}/events?limit=1000`, { token })).body
    .data as WireEvent[];
  t.match(
    lostEvents.at(-1),
    { kind: 'stage', stage: 'reattach', state: 'failed', data: /directory is gone.*next prompt builds it again/s },
    'and its conversation says what happens next',
  );
  t.equal((await sandbox(kept.sandboxId)).status, 'suspended', 'the kept one waits to be woken');

  const before = (await http.get(`/api/conversations/${kept.id}/events?limit=1000`, { token })).body.data.length;
  const prompt = await http.post(`/api/conversations/${kept.id}/prompts`, {
    token,
    body: { prompt: run64(['cat kept.txt']) },
  });
  t.equal(prompt.status, 201, prompt.text);
  t.equal(await turnSettled(http, token, kept.id), 'done', again.output);
  const events = (
    (await http.get(`/api/conversations/${kept.id}/events?limit=1000`, { token })).body.data as WireEvent[]
  ).slice(before);
  const stages = events.filter((e) => e.kind === 'stage').map((e) => `${e.stage} ${e.state}`);
  t.ok(stages.includes('reattach done'), `woken through stage reattach: ${stages}`);
  t.notOk(stages.includes('setup started'), 'not built again');
  t.equal((await sandbox(kept.sandboxId)).status, 'ready');
  const said = ranIn((await replyOf(http, token, kept.id)).reply);
  t.equal(said.at(-1)?.out, 'on-disk\n', 'on the disk it had');

  const retry = await http.post(`/api/conversations/${lost.id}/prompts`, { token, body: { prompt: 'from scratch' } });
  t.equal(retry.status, 201, retry.text);
  t.equal(await turnSettled(http, token, lost.id), 'done', 'the lost one is built again by its next prompt');
  t.ok(existsSync(lost.dir), 'in a new directory');

  // A second process with the token, on another root, while this one runs: it waits, and
  // what it holds (nothing) changes nothing of the sandboxes the connected one holds.
  const intruder = await startRunnerProcess(t, svc.url, runnerRow.token, [], { until: /waiting: another svc-runner/ });
  t.match(intruder.output, /waiting: another svc-runner/, 'the second waits');
  t.equal((await sandbox(kept.sandboxId)).status, 'ready', 'the connected runner’s sandboxes stay ready');
  t.equal((await sandbox(lost.sandboxId)).status, 'ready');
});

t.test('a runner killed mid-turn and started again ends the turn it can no longer finish', async (t) => {
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '3000' },
  });
  const { http } = svc;
  const { key: token } = await signUp(svc);
  const { agent, runnerRow, runner } = await claudeOnRunner(t, svc, token);
  const events = async (id: string) =>
    (await http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as WireEvent[];
  const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt: 'be very slow' } });
  t.equal(res.status, 201, res.text);
  const id = res.body.id as string;
  await until('the turn to speak', async () =>
    (await events(id)).some((e) => e.kind === 'output' && /tick/.test(e.data ?? '')),
  );

  // No SIGTERM: the runner and its runtime die at once, and nothing spools the turn's end.
  runner.child.kill('SIGKILL');
  await new Promise((resolve) => runner.child.once('exit', resolve));
  await startRunnerProcess(t, svc.url, runnerRow.token, [], { root: runner.root });
  t.equal(await turnSettled(http, token, id), 'interrupted', 'the turn ends instead of running for ever');
  const end = (await events(id)).filter((e) => e.kind === 'stage' && e.stage === 'turn').at(-1);
  t.match(end, { state: 'interrupted', data: /runner restarted while this turn ran/ }, 'saying why');
  const sandboxId = (await http.get(`/api/conversations/${id}`, { token })).body.sandbox_id as string;
  t.equal((await http.get(`/api/sandboxes/${sandboxId}`, { token })).body.status, 'suspended', 'its disk is kept');

  const again = await http.post(`/api/conversations/${id}/prompts`, { token, body: { prompt: 'hello again' } });
  t.equal(again.status, 201, again.text);
  t.equal(await turnSettled(http, token, id), 'done', 'the next prompt wakes the sandbox and runs');
});
