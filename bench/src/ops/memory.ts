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

/**
 * The JS heap (bytes): what V8 has committed for it, and what of that live objects use (read
 * after `collect`, so garbage is not counted).
 */
export async function heap(_svc: Service): Promise<{ total: number; used: number }> {
  const { heapTotal, heapUsed } = process.memoryUsage();
  return { total: heapTotal, used: heapUsed };
}
