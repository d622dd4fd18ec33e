/** One sample of a Prometheus text exposition: `name{labels} value`. */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
  /** The line as the server wrote it. */
  line: string;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/**
 * The samples of a text exposition (version 0.0.4); comments (`# HELP`, `# TYPE`) and blank
 * lines are skipped, any other line that is not a sample throws (a scrape that cannot be read
 * is a failure, not an empty result). Label values are unescaped.
 */
export function parseExposition(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = SAMPLE.exec(line);
    if (!m) throw new Error(`not an exposition line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(LABEL)) {
      labels[l[1] as string] = (l[2] as string).replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    }
    out.push({ name: m[1] as string, labels, value: Number(m[3]), line });
  }
  return out;
}

/**
 * The sum of `name` over every sample whose labels include `match` (so over `edge_process`,
 * the node's total), or NaN when no sample matches: a series that is absent is not zero.
 */
export function total(samples: Sample[], name: string, match: Record<string, string> = {}): number {
  const hits = samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
  return hits.length ? hits.reduce((a, s) => a + s.value, 0) : Number.NaN;
}

/** The largest value of `name` over every sample (the worst process), or NaN when absent. */
export function largest(samples: Sample[], name: string): number {
  const hits = samples.filter((s) => s.name === name);
  return hits.length ? Math.max(...hits.map((s) => s.value)) : Number.NaN;
}
