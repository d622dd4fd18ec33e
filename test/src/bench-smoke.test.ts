/**
 * A smoke run of every bench scenario: seconds, small N, through the real CLI as a user runs
 * it. It asserts only that each produces its report with figures (timings are never asserted
 * in tests: these machines are shared and noisy), not that targets are met.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';
import type { ResultFile } from '../../bench/src/lib/report.ts';
import { scenarios } from '../../bench/src/scenarios/index.ts';

const run = promisify(execFile);
// Each scenario has its own timeout below; together they outlast the default file timeout.
t.setTimeout(scenarios.length * 240_000);

for (const scenario of scenarios) {
  t.test(`bench ${scenario.name} --smoke produces figures`, { timeout: 240_000 }, async (t) => {
    const out = mkdtempSync(join(tmpdir(), `bench-smoke-${scenario.name}-`));
    const res = await run(
      process.execPath,
      ['--import', 'tsx', 'bench/src/cli.ts', scenario.name, '--smoke', '--quiet', '--out', out],
      { maxBuffer: 16 * 1024 * 1024, timeout: 230_000 },
    ).catch((err: { stdout: string; stderr: string; code: number }) => err);
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
    t.equal(result.error, undefined, 'the run did not fail');
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
