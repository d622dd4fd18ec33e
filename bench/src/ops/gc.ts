/**
 * Garbage-collection pauses inside our service over a window a scenario chooses (perf_hooks
 * `gc` entries): how often the collector stopped the event loop that delivers events, and for
 * how long, by kind.
 */
import { constants, PerformanceObserver } from 'node:perf_hooks';

const KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weak callbacks',
};

let pauses: { kind: string; ms: number }[] = [];
let observer: PerformanceObserver | undefined;

export async function start(): Promise<void> {
  observer?.disconnect();
  pauses = [];
  observer = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const kind = (e as unknown as { detail?: { kind: number } }).detail?.kind ?? -1;
      pauses.push({ kind: KINDS[kind] ?? 'other', ms: e.duration });
    }
  });
  observer.observe({ entryTypes: ['gc'] });
}

export interface GcSummary {
  pauses: number;
  totalMs: number;
  maxMs: number;
  /** Pauses of 5 ms or more: long enough to show in a p99 of a few ms. */
  over5Ms: number;
  byKind: Record<string, { pauses: number; totalMs: number; maxMs: number }>;
}

/** Stops observing and sums up the pauses seen since `start`. */
export async function stop(): Promise<GcSummary> {
  observer?.disconnect();
  observer = undefined;
  const r2 = (x: number) => Math.round(x * 100) / 100;
  const byKind: GcSummary['byKind'] = {};
  for (const p of pauses) {
    const k = byKind[p.kind] ?? { pauses: 0, totalMs: 0, maxMs: 0 };
    byKind[p.kind] = k;
    k.pauses++;
    k.totalMs += p.ms;
    k.maxMs = Math.max(k.maxMs, p.ms);
  }
  for (const k of Object.values(byKind)) {
    k.totalMs = r2(k.totalMs);
    k.maxMs = r2(k.maxMs);
  }
  return {
    pauses: pauses.length,
    totalMs: r2(pauses.reduce((a, p) => a + p.ms, 0)),
    maxMs: r2(pauses.reduce((a, p) => Math.max(a, p.ms), 0)),
    over5Ms: pauses.filter((p) => p.ms >= 5).length,
    byKind,
  };
}
