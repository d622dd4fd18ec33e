/** Percentiles of a sample (nearest rank); NaN for an empty one. Sorts in place. */
export function percentiles(sample: number[], ps: readonly number[] = [50, 90, 99, 99.9, 100]): Record<string, number> {
  sample.sort((a, b) => a - b);
  const out: Record<string, number> = {};
  for (const p of ps) {
    out[`p${p}`] =
      sample.length === 0
        ? Number.NaN
        : (sample[Math.min(sample.length - 1, Math.ceil((p / 100) * sample.length) - 1)] as number);
  }
  return out;
}

export const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN);
export const median = (xs: readonly number[]) => percentiles([...xs], [50]).p50 as number;
export const round = (x: number, digits = 2) => Number(x.toFixed(digits));

/**
 * A fixed-size latency histogram (log-spaced buckets, 0.01 ms to ~100 s) so load clients can
 * record millions of samples and send a few hundred numbers over IPC.
 */
export class Histogram {
  static readonly BUCKETS = 700;
  readonly counts = new Float64Array(Histogram.BUCKETS);
  total = 0;

  static bucketOf(ms: number): number {
    if (!(ms > 0.01)) return 0;
    return Math.min(Histogram.BUCKETS - 1, Math.floor(Math.log10(ms / 0.01) * 100));
  }

  static valueOf(bucket: number): number {
    return 0.01 * 10 ** ((bucket + 0.5) / 100);
  }

  record(ms: number): void {
    const b = Histogram.bucketOf(ms);
    this.counts[b] = (this.counts[b] as number) + 1;
    this.total++;
  }

  merge(counts: ArrayLike<number>): void {
    for (let i = 0; i < Histogram.BUCKETS; i++) {
      const c = counts[i] ?? 0;
      this.counts[i] = (this.counts[i] as number) + c;
      this.total += c;
    }
  }

  percentile(p: number): number {
    if (this.total === 0) return Number.NaN;
    const rank = Math.ceil((p / 100) * this.total);
    let seen = 0;
    for (let i = 0; i < Histogram.BUCKETS; i++) {
      seen += this.counts[i] as number;
      if (seen >= rank) return Histogram.valueOf(i);
    }
    return Histogram.valueOf(Histogram.BUCKETS - 1);
  }

  summary(): Record<string, number> {
    const out: Record<string, number> = { count: this.total };
    for (const p of [50, 90, 99, 99.9]) out[`p${p}`] = round(this.percentile(p), 3);
    return out;
  }

  toJSON(): number[] {
    return Array.from(this.counts);
  }
}
