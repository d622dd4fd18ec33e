import type { Invalidations } from './invalidation.ts';

/**
 * The embedded default: one node per store (the in-memory log and bus serve one process), so
 * there is nobody to tell. `hub` lets tests run several nodes in one process on one hub.
 */
export function memoryInvalidations(hub?: MemoryInvalidationHub): Invalidations {
  let listener: ((accountId: string) => void) | undefined;
  const me = (accountId: string) => listener?.(accountId);
  return {
    async publish(accountId) {
      hub?.send(me, accountId);
    },
    async listen(onForget) {
      listener = onForget;
      hub?.join(me);
    },
    async close() {
      hub?.leave(me);
      listener = undefined;
    },
  };
}

/** The nodes of one process that share a store; each message reaches every node but its sender. */
export class MemoryInvalidationHub {
  private readonly nodes = new Set<(accountId: string) => void>();
  join(node: (accountId: string) => void): void {
    this.nodes.add(node);
  }
  leave(node: (accountId: string) => void): void {
    this.nodes.delete(node);
  }
  send(from: (accountId: string) => void, accountId: string): void {
    for (const node of this.nodes) if (node !== from) queueMicrotask(() => node(accountId));
  }
}
