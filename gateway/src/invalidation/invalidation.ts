/**
 * How a node tells every other node that what it remembers about an account's credentials is
 * stale (a key revoked, a session ended, the account suspended, its role changed, its password
 * reset, the account deleted). One channel per deployment; every node hears every message.
 * Nodes keep in-process caches of live credentials (services/credential-cache.ts) and drop an
 * account's entries when they hear its id.
 */
export interface Invalidations {
  /**
   * Tells every other node (not this one) that the account's credentials changed. Call it after
   * the change committed. Resolves once the store took the message, or once it refused it; never
   * rejects: a message the store refused is kept and sent again until it takes it, and a node
   * that could not listen for a while forgets everything (`onReset`).
   */
  publish(accountId: string): Promise<void>;
  /**
   * `onForget` runs for each account another node published; `onReset` runs whenever this node
   * may have missed messages (it was disconnected from the store and has subscribed again), so
   * the listener forgets everything. Resolves once the node is listening.
   */
  listen(onForget: (accountId: string) => void, onReset: () => void): Promise<void>;
  /** Stops listening. */
  close(): Promise<void>;
}
