import { TurnStart, type TurnStartCommand } from '@svc/core';
import { runtimeCommandsFrom, withLocalRuntimeCommand } from 'svc-runner';
import t from 'tap';

/** A turn.start as the service sends it for `codex`: its command line, then the agent's settings. */
const turn: TurnStartCommand = {
  kind: 'turn.start',
  sandbox: 'sbx_1',
  incarnation: 0,
  conversation_id: 'cnv_1',
  turn_id: 'trn_1',
  prompt: 'hi',
  runtime: {
    command: 'codex-acp',
    args: ['--service-flag', '-c', 'model="gpt-5"'],
    name: 'codex',
    settings_args: ['-c', 'model="gpt-5"'],
    env: {},
  },
  time_limit_ms: 60_000,
};

t.test(
  "a runner's own RUNTIME_<NAME>_COMMAND replaces the service's command line and keeps the agent's settings",
  async (t) => {
    const commands = runtimeCommandsFrom({
      RUNTIME_CODEX_COMMAND: ' /opt/agents/codex-acp --profile "svc runner" ',
      RUNTIME_GEMINI_COMMAND: '   ',
      PATH: '/usr/bin',
    });
    t.same(commands, { codex: '/opt/agents/codex-acp --profile "svc runner"' }, 'blank variables set nothing');
    const local = withLocalRuntimeCommand(turn, commands);
    t.equal(local.runtime.command, '/opt/agents/codex-acp', "this machine's command runs");
    t.same(local.runtime.args, ['--profile', 'svc runner', '-c', 'model="gpt-5"'], 'its arguments, then the settings');
    t.same(withLocalRuntimeCommand(turn, {}), turn, 'without one the service command runs as sent');
    const { name: _name, settings_args: _settings, ...older } = turn.runtime;
    t.same(
      withLocalRuntimeCommand({ ...turn, runtime: older }, commands),
      { ...turn, runtime: older },
      'a turn from a service that names no runtime runs as sent',
    );
    const later = { ...turn, runtime: { ...turn.runtime, name: 'constructor' } };
    t.ok(TurnStart.safeParse(later).success, 'a runtime this runner does not know still makes a valid turn.start');
    t.same(withLocalRuntimeCommand(later, commands), later, 'and it runs as sent');
  },
);
