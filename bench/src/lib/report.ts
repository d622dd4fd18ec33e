import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { BenchOptions, Outcome, Target } from './scenario.ts';
import { renderChart } from './svg.ts';

export interface ResultFile {
  scenario: string;
  title: string;
  startedAt: string;
  finishedAt: string;
  command: string;
  options: BenchOptions;
  machine: Record<string, unknown>;
  outcome: Outcome;
  error?: string;
}

const num = (v: number | undefined) =>
  v === undefined || !Number.isFinite(v)
    ? 'n/a'
    : Math.abs(v) >= 1000
      ? Math.round(v).toLocaleString('en-US')
      : Number(v.toPrecision(3)).toString();

const verdict = (t: Target) => (t.met === null ? 'not decided' : t.met ? 'met' : '**not met**');

/** Writes `<scenario>-<date>.json`, the Markdown report beside it and its SVG charts. */
export function writeResult(dir: string, result: ResultFile): { json: string; md: string } {
  mkdirSync(dir, { recursive: true });
  const stem = `${result.scenario}-${result.startedAt.replace(/[:.]/g, '-')}`;
  const json = join(dir, `${stem}.json`);
  const md = join(dir, `${stem}.md`);
  writeFileSync(json, `${JSON.stringify(result, null, 2)}\n`);
  const lines = [
    `# ${result.title}`,
    '',
    `\`${result.command}\`, ${result.startedAt} to ${result.finishedAt}.`,
    '',
    `Machine: ${result.machine.cores} cores (${result.machine.cpuModel}), ${Math.round(Number(result.machine.memoryBytes) / 2 ** 30)} GiB, Node ${result.machine.node}.`,
    '',
  ];
  if (result.error) lines.push(`**The run failed:** ${result.error}`, '');
  if (result.outcome.targets.length) {
    lines.push(...targetTable(result.outcome.targets), '');
  }
  if (result.outcome.clientCpuSeconds !== undefined) {
    lines.push(`Load clients used ${num(result.outcome.clientCpuSeconds)} CPU seconds.`, '');
  }
  for (const note of result.outcome.notes) lines.push(`- ${note}`);
  if (result.outcome.notes.length) lines.push('');
  for (const chart of result.outcome.charts) {
    const file = `${stem}-${chart.file}.svg`;
    writeFileSync(join(dir, file), renderChart(chart));
    lines.push(`![${chart.title}](${file})`, '');
  }
  lines.push('## Figures', '', '```json', JSON.stringify(result.outcome.figures, null, 2), '```', '');
  writeFileSync(md, lines.join('\n'));
  return { json, md };
}

export function targetTable(targets: Target[], scenario?: string): string[] {
  const head = scenario === undefined ? '' : 'scenario | ';
  const rows = [
    `| ${head}what | ours | baseline | ratio | target | verdict |`,
    `|${scenario === undefined ? '' : '---|'}---|---|---|---|---|---|`,
  ];
  for (const t of targets) {
    const baseline = t.baseline ? `${num(t.baseline.value)} (${t.baseline.name})` : '-';
    const ratio = t.ratio === undefined ? '-' : t.ratio.toFixed(2);
    const note = t.note ? ` (${t.note})` : '';
    rows.push(
      `| ${scenario === undefined ? '' : `${scenario} | `}${t.what} | ${num(t.value)} ${t.unit} | ${baseline} | ${ratio} | ${t.goal} | ${verdict(t)}${note} |`,
    );
  }
  return rows;
}

/** The newest full (not smoke) result of each scenario in `dir`. */
export function latestResults(dir: string): ResultFile[] {
  let files: string[];
  try {
    files = readdirSync(dir).filter((f) => f.endsWith('.json'));
  } catch {
    return [];
  }
  const latest = new Map<string, ResultFile>();
  for (const f of files.sort()) {
    try {
      const r = JSON.parse(readFileSync(join(dir, f), 'utf8')) as ResultFile;
      if (!r.scenario || r.options?.smoke) continue;
      const seen = latest.get(r.scenario);
      if (!seen || seen.startedAt < r.startedAt) latest.set(r.scenario, r);
    } catch {
      // not a result file
    }
  }
  return [...latest.values()];
}

const START = '<!-- ratios:start -->';
const END = '<!-- ratios:end -->';

/** Rewrites the table between the markers of bench/README.md from the latest results. */
export function updateReadme(readme: string, dir: string, order: readonly string[]): void {
  const results = latestResults(dir).sort((a, b) => order.indexOf(a.scenario) - order.indexOf(b.scenario));
  const body: string[] = [];
  for (const r of results) {
    body.push(
      `### ${r.scenario}: ${r.title}`,
      '',
      `\`${r.command}\` (${r.startedAt.slice(0, 16).replace('T', ' ')} UTC, ${r.machine.cores} cores; report: [results/${r.scenario}-${r.startedAt.replace(/[:.]/g, '-')}.md](results/${r.scenario}-${r.startedAt.replace(/[:.]/g, '-')}.md))`,
      '',
    );
    if (r.error) body.push(`The run failed: ${r.error}`, '');
    if (r.outcome.targets.length) body.push(...targetTable(r.outcome.targets), '');
  }
  if (body.length === 0) body.push('No full run recorded yet: `npm run bench -- all`.', '');
  const text = readFileSync(readme, 'utf8');
  const a = text.indexOf(START);
  const b = text.indexOf(END);
  if (a < 0 || b < a) throw new Error(`${readme} lacks the ${START} / ${END} markers`);
  writeFileSync(readme, `${text.slice(0, a + START.length)}\n\n${body.join('\n')}\n${text.slice(b)}`);
}
