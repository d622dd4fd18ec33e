import type { Progress } from './progress.ts';
import type { Chart } from './svg.ts';

/** What the command line asked for; a scenario fills what was not given from its defaults. */
export interface BenchOptions {
  connections: number;
  duration: number;
  rate: number;
  /** An existing Redis to use instead of a throwaway one the scenario starts. */
  redis: string | undefined;
  /** Seconds, small N: only proves the scenario produces figures (npm test runs this). */
  smoke: boolean;
}

export interface Context {
  opts: BenchOptions;
  progress: Progress;
  /** Registers a clean-up that runs when the scenario ends, however it ends (last first). */
  defer(fn: () => Promise<unknown> | unknown): void;
}

/**
 * One row of the ratios table. `value` is ours; `baseline` is the peer or ceiling measured in
 * the same run (absent for an absolute bar such as "18,000 watchers"). `met` is null when the
 * run could not decide (a smoke run's small N, a peer that could not start).
 */
export interface Target {
  what: string;
  unit: string;
  value: number;
  baseline?: { name: string; value: number };
  ratio?: number;
  goal: string;
  met: boolean | null;
  note?: string;
}

export interface Outcome {
  /** Every figure measured, for the JSON. */
  figures: Record<string, unknown>;
  targets: Target[];
  charts: Chart[];
  /** Plain sentences for the report: what was measured how, and what the figures mean. */
  notes: string[];
  /** CPU seconds the load clients used (so a reader can tell the client was not the limit). */
  clientCpuSeconds?: number;
}

export interface Scenario {
  name: string;
  title: string;
  defaults: { connections: number; duration: number; rate: number };
  /** The defaults of a smoke run. */
  smoke: { connections: number; duration: number; rate: number };
  run(ctx: Context): Promise<Outcome>;
}

/** A target "ours / baseline >= min" (higher is better) or "<= max" (lower is better). */
export function ratioTarget(
  what: string,
  unit: string,
  value: number,
  baseline: { name: string; value: number } | undefined,
  goal: { atLeast: number } | { atMost: number },
  decide = true,
): Target {
  if (!baseline || !Number.isFinite(baseline.value) || baseline.value === 0 || !Number.isFinite(value)) {
    return {
      what,
      unit,
      value,
      baseline,
      goal: goalText(goal),
      met: null,
      note: baseline ? 'no baseline figure' : 'baseline not measured',
    };
  }
  const ratio = value / baseline.value;
  const met = 'atLeast' in goal ? ratio >= goal.atLeast : ratio <= goal.atMost;
  return { what, unit, value, baseline, ratio, goal: goalText(goal), met: decide ? met : null };
}

/** A target shown for information: its figures stay, but it is not decided (`goal` says so). */
export function reported(t: Target, goal = 'reported'): Target {
  return { ...t, goal, met: null };
}

/** An absolute bar: `value >= atLeast` or `value <= atMost`. */
export function absoluteTarget(
  what: string,
  unit: string,
  value: number,
  goal: { atLeast: number } | { atMost: number },
  decide = true,
): Target {
  const met = 'atLeast' in goal ? value >= goal.atLeast : value <= goal.atMost;
  const text = 'atLeast' in goal ? `>= ${goal.atLeast} ${unit}` : `<= ${goal.atMost} ${unit}`;
  return { what, unit, value, goal: text, met: decide && Number.isFinite(value) ? met : null };
}

function goalText(goal: { atLeast: number } | { atMost: number }): string {
  return 'atLeast' in goal ? `ratio >= ${goal.atLeast}` : `ratio <= ${goal.atMost}`;
}
