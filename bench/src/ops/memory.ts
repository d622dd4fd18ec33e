import type { Service } from '../../../gateway/src/main.ts';

/**
 * A full collection inside the target (when node runs with --expose-gc), so a memory reading
 * after it counts what is held rather than garbage not yet collected.
 */
export async function collect(_svc: Service): Promise<boolean> {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) return false;
  gc();
  await new Promise((r) => setTimeout(r, 50));
  gc();
  return true;
}

/** Whether this build knows EDGE_PROCESSES (several edge processes on one port), and its value. */
export async function edgeProcesses(svc: Service): Promise<number | null> {
  const v = (svc.config as unknown as Record<string, unknown>).EDGE_PROCESSES;
  return v === undefined ? null : Number(v);
}

/** The JS heap in use (bytes), after a collection when node runs with --expose-gc. */
export async function heapUsed(svc: Service): Promise<number> {
  await collect(svc);
  return process.memoryUsage().heapUsed;
}
