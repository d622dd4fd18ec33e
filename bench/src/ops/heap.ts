import { writeHeapSnapshot } from 'node:v8';
export async function snap(_svc: unknown, args: { file: string }) {
  (globalThis as { gc?: () => void }).gc?.();
  writeHeapSnapshot(args.file);
  const m = process.memoryUsage();
  return { rss: m.rss, heapUsed: m.heapUsed, external: m.external, arrayBuffers: m.arrayBuffers };
}
