import type { Invalidations } from '../invalidation/invalidation.ts';

/** What authentication remembers of a live key or session: enough to build a principal. */
export interface CachedCredential {
  accountId: string;
  actor: 'api' | 'ui';
  scope: 'full' | 'standard';
  role: 'user' | 'admin';
  credentialId: string;
  suspended: boolean;
  /** Epoch ms after which the credential is dead whatever the cache says; null never. */
  expiresAt: number | null;
  /** Epoch ms of the last stamp of `last_used_at` (API keys); null for none yet or a session. */
  lastUsedAt: number | null;
}

/**
 * Live API keys and browser sessions by the hash of their secret, so an authenticated request
 * does not query Postgres each time (SELECT of the credential and its account). An entry lives
 * at most `ttlMs`, never past the credential's own expiry, and goes at once, on every node,
 * when its account's credentials change: the service calls `forgetAccount` after every such
 * change (revoke, sign-out, password reset, email change, suspension, role change, erasure),
 * which forgets locally and tells the other nodes through `Invalidations`. A node that may have
 * missed a message forgets everything. Sandbox tokens are not cached: their conversation's end
 * revokes them, and they are few.
 *
 * A lookup that started before a forget must not store what it read: it may predate the change.
 * Each lookup takes a ticket (`begin`), and `put` stores only when no forget happened since.
 * Unknown secrets are never remembered, so a new key works at once and guessing fills nothing.
 */
export class CredentialCache {
  private readonly entries = new Map<string, { credential: CachedCredential; until: number }>();
  private forgets = 0;
  private readonly now: () => number;

  constructor(
    private readonly o: {
      /** How long an entry may be used without asking Postgres again; 0 turns the cache off. */
      ttlMs: number;
      /** Entries kept at most; the oldest goes first. */
      maxEntries: number;
      invalidations: Invalidations;
      now?: () => number;
    },
  ) {
    this.now = o.now ?? Date.now;
  }

  /** Starts listening for other nodes' changes. */
  async start(): Promise<void> {
    await this.o.invalidations.listen(
      (accountId) => this.forgetHere(accountId),
      () => this.clear(),
    );
  }

  async stop(): Promise<void> {
    await this.o.invalidations.close();
    this.clear();
  }

  /** The live credential remembered under this hash, if any (expired entries are dropped). */
  get(hash: string): CachedCredential | undefined {
    const entry = this.entries.get(hash);
    if (!entry) return undefined;
    const now = this.now();
    const expiresAt = entry.credential.expiresAt;
    if (entry.until <= now || (expiresAt !== null && expiresAt <= now)) {
      this.entries.delete(hash);
      return undefined;
    }
    return entry.credential;
  }

  /** A ticket for a lookup about to read Postgres; hand it back to `put`. */
  begin(): number {
    return this.forgets;
  }

  /** Remembers what a lookup read, unless a forget happened since its ticket. */
  put(hash: string, credential: CachedCredential, ticket: number): void {
    if (this.o.ttlMs <= 0 || ticket !== this.forgets) return;
    if (this.entries.size >= this.o.maxEntries && !this.entries.has(hash)) {
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    this.entries.set(hash, { credential, until: this.now() + this.o.ttlMs });
  }

  /**
   * The account's credentials changed (the change has committed): forget them here now and on
   * every other node as soon as it hears. Resolves once the other nodes are told.
   */
  async forgetAccount(accountId: string): Promise<void> {
    this.forgetHere(accountId);
    await this.o.invalidations.publish(accountId);
  }

  private forgetHere(accountId: string): void {
    this.forgets++;
    for (const [hash, entry] of this.entries) {
      if (entry.credential.accountId === accountId) this.entries.delete(hash);
    }
  }

  private clear(): void {
    this.forgets++;
    this.entries.clear();
  }

  /** How many entries are held (for tests and metrics). */
  get size(): number {
    return this.entries.size;
  }
}
