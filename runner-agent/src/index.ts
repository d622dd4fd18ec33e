/**
 * runner-agent: installed on tenant machines, it connects out to the service over `ws`,
 * says who it is, keeps heartbeats and reconnects, and drives ACP runtimes over stdio
 * (`AcpRuntime`); sandboxes come next (issue 6).
 * The CLI is `svc-runner` (src/cli.ts); this is the library.
 */
export { RUNNER_PROTOCOL_VERSION } from '@svc/core';
export { type AgentEvent, type AgentOptions, type AgentStop, connectUrl, RunnerAgent } from './agent.ts';
export { brokerHeaders, PLACEHOLDER_REFUSED, placeholderGuard, SandboxBroker, SandboxCa } from './broker.ts';
export { destination, type EgressGrant, EgressProxy, insideAddress } from './egress-proxy.ts';
export { firewallRules, installCommands, installFirewall, removeCommands, removeFirewall } from './firewall.ts';
export { hostAllowed } from './hosts.ts';
export { type Bridges, bridgeScript, findCommand, Isolation, type IsolationMode } from './isolation.ts';
export {
  allowAnswer,
  ConversationPermissions,
  denyAnswer,
  offeredOptions,
  type PermissionPolicy,
  policyAsks,
} from './permissions.ts';
export {
  AcpRuntime,
  type AcpRuntimeOptions,
  type PermissionAnswer,
  type PromptResult,
  type TurnUsage,
} from './runtime.ts';
export { type RuntimeCommands, runtimeCommandsFrom, withLocalRuntimeCommand } from './runtime-commands.ts';
export { AGENT_VERSION } from './version.ts';
