/**
 * An idle sandbox on a tenant's runner is suspended as a `local` one is (SANDBOX_IDLE_SUSPEND_MS):
 * its runtimes stop, the runner stays connected with the disk, and the next prompt wakes it there
 * (stage `reattach`, a fresh runtime session, the disk as it was).
 */
import t from 'tap';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { argv, descendants } from './npm-start.ts';
import { claudeOnRunner, SCRIPTED_AGENT_COMMAND } from './runner-process.ts';
import { ranIn, replyOf, run64, turnSettled } from './scripted-turns.ts';
import type { WireEvent } from './sse-client.ts';
import { until } from './until.ts';

t.test('an idle sandbox on a runner is suspended on it and woken there by the next prompt', async (t) => {
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, SANDBOX_IDLE_SUSPEND_MS: '1500' },
  });
  const { http } = svc;
  const { key: token } = await signUp(svc);
  const { agent, runnerRow, runner } = await claudeOnRunner(t, svc, token);
  /** The runtimes the runner runs now (the scripted agent, inside its sandbox). */
  const runtimes = () =>
    descendants(runner.child.pid as number).filter((pid) => argv(pid).some((a) => a.includes('scripted-acp-agent')));
  const events = async (id: string) =>
    (await http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as WireEvent[];

  const res = await http.post('/api/conversations', {
    token,
    body: { agent_id: agent.id, prompt: run64(['echo on-disk > kept.txt']) },
  });
  t.equal(res.status, 201, res.text);
  const id = res.body.id as string;
  t.equal(await turnSettled(http, token, id), 'done');
  const sandboxId = (await http.get(`/api/conversations/${id}`, { token })).body.sandbox_id as string;
  const sandbox = async () => (await http.get(`/api/sandboxes/${sandboxId}`, { token })).body;
  t.ok(runtimes().length > 0, 'its runtime runs on the runner after the turn');

  await until('the idle sandbox to be suspended', async () => (await sandbox()).status === 'suspended', 20_000);
  t.match(await sandbox(), { status: 'suspended', runner: { id: runnerRow.id } }, 'suspended on its runner');
  t.ok(
    await until('its runtimes to stop', () => runtimes().length === 0, 20_000),
    'the runtime and what it started are gone',
  );
  t.ok(
    await until('the runner to say so', () => runner.output.includes(`sandbox ${sandboxId} suspended`)),
    'the runner says so',
  );
  t.ok(svc.fabric.isLive(runnerRow.id), 'the runner stays connected');
  const suspend = (await events(id)).find((e) => e.kind === 'stage' && e.stage === 'suspend');
  t.match(suspend, { state: 'done' }, 'the conversation shows stage suspend');
  t.match(JSON.parse(suspend?.data ?? '{}'), { runtimes: 'stopped', runner: 'connected', disk: 'kept' });

  const before = (await events(id)).length;
  const prompt = await http.post(`/api/conversations/${id}/prompts`, {
    token,
    body: { prompt: run64(['cat kept.txt']) },
  });
  t.equal(prompt.status, 201, prompt.text);
  t.equal(await turnSettled(http, token, id), 'done', runner.output);
  const stages = (await events(id))
    .slice(before)
    .filter((e) => e.kind === 'stage')
    .map((e) => `${e.stage} ${e.state}`);
  t.ok(stages.includes('reattach done'), `woken through stage reattach: ${stages}`);
  t.notOk(stages.includes('setup started'), 'not built again');
  t.equal(ranIn((await replyOf(http, token, id)).reply).at(-1)?.out, 'on-disk\n', 'on the disk it had');
  t.equal((await sandbox()).status, 'ready');
  t.ok(runtimes().length > 0, 'a fresh runtime runs it');
});
