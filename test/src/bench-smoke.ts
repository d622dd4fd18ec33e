/**
 * A smoke run of every bench scenario: seconds, small N, through the real CLI as a user runs
 * it. It asserts only that each produces its report with figures (timings are never asserted
 * in tests: these machines are shared and noisy), not that targets are met. The scenarios run
 * in five files (bench-smoke-<group>.test.ts), so the suite runs them side by side; the
 * scripts' file checks that the groups hold every scenario.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import t, { type Test } from 'tap';
import { CLI_BUNDLE, ensureCliBundle } from '../../bench/bundle.mjs';
import type { ResultFile } from '../../bench/src/lib/report.ts';
import type { Scenario } from '../../bench/src/lib/scenario.ts';
import { scenarios } from '../../bench/src/scenarios/index.ts';

const run = promisify(execFile);

/**
 * The CLI `npm run bench` runs, from its build (bench/bundle.mjs, which test/run.mjs makes
 * before the run) when it can be made current, else its source through tsx as npm's script.
 */
const CLI: Promise<string[]> = ensureCliBundle().then((built) =>
  built ? [CLI_BUNDLE] : ['--import', 'tsx', 'bench/src/cli.ts'],
);

/** The scenarios of each bench-smoke file, by name. */
export const GROUPS: Record<string, string[]> = {
  sse: ['sse-idle', 'sse-fanout'],
  'sse-tenant': ['sse-tenant', 'sse-ceiling'],
  log: ['ingest', 'replay', 'slow-watcher', 'scaling'],
  api: ['crud', 'runners', 'metrics', 'webhook-consume', 'embedded'],
};

/** Smoke runs of the group's scenarios, each with its own timeout. */
export function smokeScenarios(group: string): void {
  const names = GROUPS[group] ?? [];
  t.setTimeout((names.length + 1) * 240_000);
  for (const scenario of scenarios.filter((s) => names.includes(s.name))) smokeScenario(scenario);
}

function smokeScenario(scenario: Scenario): void {
  t.test(`bench ${scenario.name} --smoke produces figures`, { timeout: 240_000 }, async (t) => {
    const out = mkdtempSync(join(tmpdir(), `bench-smoke-${scenario.name}-`));
    const res = await run(process.execPath, [...(await CLI), scenario.name, '--smoke', '--quiet', '--out', out], {
      maxBuffer: 16 * 1024 * 1024,
      timeout: 230_000,
    }).catch((err: { stdout: string; stderr: string; code: number }) => err);
    t.equal('code' in res ? res.code : 0, 0, `exit status (${String(res.stderr).slice(-2000)})`);
    const files = readdirSync(out);
    const json = files.find((f) => f.startsWith(`${scenario.name}-`) && f.endsWith('.json'));
    t.ok(json, 'a JSON result is written');
    t.ok(
      files.some((f) => f.endsWith('.md')),
      'a Markdown report is written',
    );
    if (!json) return;
    const result = JSON.parse(readFileSync(join(out, json), 'utf8')) as ResultFile;
    if (result.error !== undefined) {
      // The rest would only fail for the same reason.
      t.fail(`the run failed: ${result.error}`);
      return;
    }
    t.equal(result.scenario, scenario.name);
    t.ok(result.options.smoke, 'the options are recorded');
    t.ok(Number(result.machine.cores) > 0, 'the machine is recorded');
    t.ok(result.outcome.targets.length > 0, 'targets are reported');
    // A memory figure is an RSS difference: with a smoke run's few hundred sockets it is noise
    // and may even come out negative, so figures are checked for being measured, not for size.
    const memory = (what: string) => /memory|bytes|RSS/i.test(what);
    for (const target of result.outcome.targets) {
      t.ok(
        Number.isFinite(target.value) && (memory(target.what) || target.value > 0),
        `${target.what}: ours is a figure (${target.value})`,
      );
      if (target.baseline) {
        t.ok(
          Number.isFinite(target.baseline.value) && (memory(target.what) || target.baseline.value > 0),
          `${target.what}: ${target.baseline.name} is a figure (${target.baseline.value})`,
        );
      }
    }
    const md = readFileSync(join(out, json.replace(/\.json$/, '.md')), 'utf8');
    t.match(md, /\| what \| ours \| baseline \|/, 'the report holds the ratios table');
    for (const chart of result.outcome.charts) {
      const svg = readFileSync(join(out, json.replace(/\.json$/, `-${chart.file}.svg`)), 'utf8');
      t.match(svg, /^<svg [^>]*>[\s\S]*<\/svg>\n$/, `chart ${chart.file} is an SVG`);
    }
  });
}

/**
 * The stand-alone bench scripts with a small mode, run as a user runs them (`npm run
 * bench:<name> -- --smoke --out DIR`): each must exit 0 and write its JSON and Markdown report
 * holding measured figures. `check` names the figures that must be there.
 */
const scripts: { script: string; prefix: string; check: (t: Test, json: Record<string, unknown>) => void }[] = [
  {
    script: 'bench:search',
    prefix: 'search-',
    check: (t, json) => {
      const results = json.results as { label: string; medianMs: number; plan: string }[];
      t.ok(results.length > 0, 'queries are timed');
      for (const r of results) {
        t.ok(Number.isFinite(r.medianMs) && r.medianMs > 0, `${r.label}: a median (${r.medianMs} ms)`);
        t.match(r.plan, /Scan|Index|Limit/, `${r.label}: the plan is recorded`);
      }
    },
  },
  {
    script: 'bench:export',
    prefix: 'export-',
    check: (t, json) => {
      t.equal(json.events_written, json.events, 'every event is in the account before the export');
      t.ok(Number(json.seconds) > 0, `the build is timed (${json.seconds} s)`);
      t.ok(Number(json.file_mb) > 0, `the file's size is read (${json.file_mb} MB)`);
      t.ok(Number.isFinite(json.heap_peak_growth_mb), 'the heap growth is read');
    },
  },
  {
    script: 'bench:webhooks',
    prefix: 'webhook-delivery-',
    check: (t, json) => {
      for (const mode of ['consumer', 'direct'] as const) {
        const m = json[mode] as {
          burst: { deliveries: number; perSecond: number };
          paced: { deliveries: number; delayMs: { p50: number } };
        };
        t.ok(m.burst.deliveries > 0 && m.burst.perSecond > 0, `${mode}: burst deliveries/s (${m.burst.perSecond})`);
        t.ok(m.paced.deliveries > 0 && m.paced.delayMs.p50 > 0, `${mode}: paced delay p50 (${m.paced.delayMs.p50} ms)`);
      }
    },
  },
];

/** Smoke runs of the stand-alone scripts, and the check that the groups cover every scenario. */
export function smokeScripts(): void {
  t.setTimeout((scripts.length + 1) * 240_000);
  t.test('every bench scenario is in one bench-smoke group', async (t) => {
    const grouped = Object.values(GROUPS).flat();
    t.same([...grouped].sort(), scenarios.map((s) => s.name).sort(), 'each scenario once');
  });
  for (const entry of scripts) smokeScript(entry);
}

function smokeScript({ script, prefix, check }: (typeof scripts)[number]): void {
  t.test(`npm run ${script} -- --smoke produces figures`, { timeout: 240_000 }, async (t) => {
    const out = mkdtempSync(join(tmpdir(), `bench-smoke-${script.replace(':', '-')}-`));
    const res = await run('npm', ['run', '-s', script, '--', '--smoke', '--out', out], {
      maxBuffer: 16 * 1024 * 1024,
      timeout: 230_000,
    }).catch((err: { stdout: string; stderr: string; code: number }) => err);
    t.equal('code' in res ? res.code : 0, 0, `exit status (${String(res.stderr).slice(-2000)})`);
    const files = readdirSync(out);
    const json = files.find((f) => f.startsWith(prefix) && f.endsWith('.json'));
    t.ok(json, 'a JSON result is written');
    t.ok(
      files.some((f) => f.startsWith(prefix) && f.endsWith('.md')),
      'a Markdown report is written',
    );
    if (json) check(t, JSON.parse(readFileSync(join(out, json), 'utf8')) as Record<string, unknown>);
  });
}
