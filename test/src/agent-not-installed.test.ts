// A turn whose agent command is not installed fails `agent_not_installed`, and the message
// names the setting to change where it is read: on a self-hosted runner, RUNTIME_<NAME>_COMMAND
// in that runner's environment on its machine (which wins over the service's); on a `local`
// sandbox, the service's own.
import t from 'tap';
import { signUp, startTestService } from './harness.ts';
import { claudeAgent, startRunnerProcess } from './runner-process.ts';
import { turnSettled } from './scripted-turns.ts';

const SERVICE_COMMAND = 'svc-test-service-names-no-such-agent';
const RUNNER_COMMAND = 'svc-test-runner-names-no-such-agent';

/** A conversation of `agentId` launched and its first turn's record once it has ended. */
async function failedTurn(svc: Awaited<ReturnType<typeof startTestService>>, token: string, agentId: string) {
  const created = await svc.http.post('/api/conversations', { token, body: { agent_id: agentId, prompt: 'Hello?' } });
  if (created.status !== 201) throw new Error(`launch: ${created.status} ${created.text}`);
  await turnSettled(svc.http, token, created.body.id as string);
  const turns = (await svc.http.get(`/api/conversations/${created.body.id}/turns`, { token })).body.data;
  return turns[0] as { state: string; error: { code: string; message: string } | null };
}

t.test('on a self-hosted runner, a missing agent command names the runner’s RUNTIME_CLAUDE_COMMAND', async (t) => {
  const svc = await startTestService(t, {
    env: { RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '5000', RUNTIME_CLAUDE_COMMAND: SERVICE_COMMAND },
  });
  const { http } = svc;
  const { key: token } = await signUp(svc);
  const { agent } = await claudeAgent(t, http, token, 'runner');

  t.test('the runner’s own setting names a command its machine lacks', async (t) => {
    const row = (await http.post('/api/runners', { token, body: { name: 'own setting' } })).body;
    const runner = await startRunnerProcess(t, svc.url, row.token, [], {
      env: { RUNTIME_CLAUDE_COMMAND: RUNNER_COMMAND },
    });
    t.match(runner.output, `runtime claude: ${RUNNER_COMMAND} (set on this machine)`);
    const turn = await failedTurn(svc, token, agent.id);
    t.match(turn, { state: 'failed', error: { code: 'agent_not_installed' } }, runner.output);
    const message = turn.error?.message ?? '';
    t.match(message, `The agent command ${RUNNER_COMMAND} is not installed on the runner's machine`);
    t.match(message, "set RUNTIME_CLAUDE_COMMAND in svc-runner's environment on that machine", 'the runner’s setting');
    t.notMatch(message, "service's", 'not the service’s, which this runner does not run');
    t.notMatch(message, SERVICE_COMMAND);
    t.match(message, 'npm install -g @zed-industries/claude-agent-acp', 'and how to install the agent there');
    // Out of the way of the next runner.
    t.equal((await http.delete(`/api/runners/${row.id}`, { token })).status, 204);
  });

  t.test('the service’s command, run by a runner that sets none, is missing on the runner', async (t) => {
    const row = (await http.post('/api/runners', { token, body: { name: 'no setting' } })).body;
    const runner = await startRunnerProcess(t, svc.url, row.token);
    const turn = await failedTurn(svc, token, agent.id);
    t.match(turn, { state: 'failed', error: { code: 'agent_not_installed' } }, runner.output);
    const message = turn.error?.message ?? '';
    t.match(message, `The agent command ${SERVICE_COMMAND} is not installed on the runner's machine`);
    t.match(message, "set RUNTIME_CLAUDE_COMMAND in svc-runner's environment on that machine");
    t.notMatch(message, "the service's RUNTIME_CLAUDE_COMMAND");
  });
});

t.test('on a local sandbox, a missing agent command names the service’s RUNTIME_CLAUDE_COMMAND', async (t) => {
  const svc = await startTestService(t, { env: { RUNTIME_CLAUDE_COMMAND: SERVICE_COMMAND } });
  const { key: token } = await signUp(svc);
  // On the instance's default provider, `local`.
  const { agent } = await claudeAgent(t, svc.http, token);
  const turn = await failedTurn(svc, token, agent.id);
  t.match(turn, { state: 'failed', error: { code: 'agent_not_installed' } });
  const message = turn.error?.message ?? '';
  t.match(message, `The agent command ${SERVICE_COMMAND} is not installed on the machine running the sandbox`);
  t.match(message, "set the service's RUNTIME_CLAUDE_COMMAND to its path");
  t.notMatch(message, 'svc-runner', 'no runner of the operator’s is involved');
});
