import { ApiError } from '@svc/core';
import { type RouterNodeOptions, type RunnerRouter, relayedError } from './router.ts';

/**
 * What the nodes of one process share: who holds each runner, and each node's handlers. The
 * in-process counterpart of the Redis keys and channels.
 */
export interface MemoryRouterHub {
  readonly claims: Map<string, { node: symbol; until: number }>;
  readonly nodes: Map<symbol, Pick<RouterNodeOptions, 'run' | 'onDurable' | 'onDisconnect'>>;
}

export function memoryRouterHub(): MemoryRouterHub {
  return { claims: new Map(), nodes: new Map() };
}

/**
 * The router inside one process: nodes that share `hub` route to each other like nodes on one
 * Redis. A node alone on its hub has nothing to route to, as a single node without Redis.
 */
export function memoryRunnerRouter(o: RouterNodeOptions & { hub?: MemoryRouterHub }): RunnerRouter {
  const hub = o.hub ?? memoryRouterHub();
  const node = Symbol('node');
  hub.nodes.set(node, { run: o.run, onDurable: o.onDurable, onDisconnect: o.onDisconnect });
  const waiting = new Set<(err: ApiError) => void>();

  return {
    hold(runnerId) {
      hub.claims.set(runnerId, { node, until: Date.now() + o.holdMs });
    },
    release(runnerId) {
      if (hub.claims.get(runnerId)?.node === node) hub.claims.delete(runnerId);
    },
    async forward(runnerId, body) {
      const claim = hub.claims.get(runnerId);
      const holder = claim && claim.node !== node && claim.until > Date.now() ? hub.nodes.get(claim.node) : undefined;
      if (!holder) throw new ApiError('runner_offline');
      return new Promise<void>((resolve, reject) => {
        const fail = (err: ApiError) => {
          clearTimeout(timer);
          if (waiting.delete(fail)) reject(err);
        };
        const timer = setTimeout(
          () => fail(new ApiError('runner_offline', 'The runner did not acknowledge the command in time.')),
          o.timeoutMs,
        );
        waiting.add(fail);
        holder.run(runnerId, body).then(
          () => {
            clearTimeout(timer);
            if (waiting.delete(fail)) resolve();
          },
          (err: Error) => fail(relayedError(err instanceof ApiError ? err.code : 'runner_offline', err.message)),
        );
      });
    },
    durable(marks) {
      if (marks.size === 0) return;
      for (const [other, handlers] of hub.nodes) if (other !== node) handlers.onDurable(new Map(marks));
    },
    async disconnect(who, code, reason) {
      for (const [other, handlers] of hub.nodes) if (other !== node) handlers.onDisconnect(who, code, reason);
    },
    async close() {
      hub.nodes.delete(node);
      for (const fail of [...waiting]) fail(new ApiError('runner_offline', 'The service is shutting down.'));
    },
  };
}
