import { commandLine, RUNTIMES, type Runtime, type TurnStartCommand } from '@svc/core';

/**
 * Runtime command lines set on the runner's own machine (RUNTIME_<NAME>_COMMAND in its
 * environment, as on the service). They win over the service's: the operator knows where the
 * agents' CLIs are installed here, and which versions to run.
 */
export type RuntimeCommands = Partial<Record<Runtime, string>>;

/** The RUNTIME_<NAME>_COMMAND variables of `env` that name a command (blank ones are ignored). */
export function runtimeCommandsFrom(env: NodeJS.ProcessEnv): RuntimeCommands {
  const commands: RuntimeCommands = {};
  for (const runtime of RUNTIMES) {
    const line = env[`RUNTIME_${runtime.toUpperCase()}_COMMAND`]?.trim();
    if (line) commands[runtime] = line;
  }
  return commands;
}

/**
 * The turn as this runner runs it: when the machine sets the command of the turn's runtime,
 * that command line followed by the arguments of the agent's settings; otherwise the command
 * the service sent. A service one release older names no runtime: its command is run as sent.
 */
export function withLocalRuntimeCommand(turn: TurnStartCommand, commands: RuntimeCommands): TurnStartCommand {
  const name = turn.runtime.name;
  const line = name && (RUNTIMES as readonly string[]).includes(name) ? commands[name as Runtime] : undefined;
  if (!line) return turn;
  const { command, args } = commandLine(line);
  return { ...turn, runtime: { ...turn.runtime, command, args: [...args, ...(turn.runtime.settings_args ?? [])] } };
}
