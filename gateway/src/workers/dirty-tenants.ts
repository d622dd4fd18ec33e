import type { Logger } from 'pino';

/**
 * One pass over the tenants marked in `dirty`, one at a time. Each tenant is unmarked before
 * `work` runs on it, so a mark made during its work is seen by the next pass; a tenant whose
 * work throws is marked again and logged with `failed`, to be retried by the next pass, and
 * the pass goes on with the other tenants.
 */
export async function workThroughDirty(
  dirty: Set<string>,
  work: (tenant: string) => Promise<unknown>,
  logger: Logger,
  failed: string,
): Promise<void> {
  for (const tenant of [...dirty]) {
    dirty.delete(tenant);
    try {
      await work(tenant);
    } catch (err) {
      dirty.add(tenant);
      logger.error({ err: { message: (err as Error).message }, tenant }, failed);
    }
  }
}
