import type { Logger } from 'pino';

/** What a retirement is about: the identity sandboxes were built for. */
export interface RetireTarget {
  accountId: string;
  environmentId?: string;
  vaultId?: string;
  agentId?: string;
  reason: 'agent_environment_changed' | 'environment_deleted' | 'vault_deleted';
}

/**
 * The seam every change that invalidates a machine goes through (SPEC: a persistent sandbox
 * is retired like a reset when its agent's environment changes or its environment or vault
 * is deleted; a machine mid-turn is left until the turn ends). Resolves to how many sandboxes
 * were retired.
 */
export type RetireSandboxesBuiltOn = (target: RetireTarget) => Promise<number>;

/**
 * Until the sandbox issue lands there are no sandboxes to retire, so this finds none; it logs
 * the call so the seam is visible in operation.
 */
export function retireSandboxesBuiltOn(log: Logger): RetireSandboxesBuiltOn {
  return async (target) => {
    log.debug({ target }, 'retire sandboxes: none exist yet');
    return 0;
  };
}
