/**
 * `npm run bench -- <scenario|all> [--connections N] [--duration S] [--rate R] [--redis URL]
 * [--smoke] [--out DIR]`: runs scenarios that measure our gateway and, in the same run, the
 * peer or ceiling each is compared with; writes bench/results/<scenario>-<date>.{json,md} with
 * SVG charts and refreshes the ratios table of bench/README.md.
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { describeMachine, repoRoot } from './lib/machine.ts';
import { Progress } from './lib/progress.ts';
import { type ResultFile, targetTable, updateReadme, writeResult } from './lib/report.ts';
import type { BenchOptions, Outcome } from './lib/scenario.ts';
import { scenarios } from './scenarios/index.ts';

const usage = `usage: npm run bench -- <scenario|all> [--connections N] [--duration S] [--rate R] [--redis URL] [--smoke] [--out DIR]
scenarios: ${scenarios.map((s) => s.name).join(', ')}`;

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    connections: { type: 'string' },
    duration: { type: 'string' },
    rate: { type: 'string' },
    redis: { type: 'string' },
    smoke: { type: 'boolean', default: false },
    out: { type: 'string' },
    quiet: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});

const name = positionals[0];
if (values.help || !name) {
  process.stdout.write(`${usage}\n`);
  process.exit(name || values.help ? 0 : 64);
}
const chosen = name === 'all' ? scenarios : scenarios.filter((s) => s.name === name);
if (chosen.length === 0) {
  process.stderr.write(`unknown scenario ${name}\n${usage}\n`);
  process.exit(64);
}
const positive = (flag: string, v: string | undefined): number | undefined => {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) {
    process.stderr.write(`--${flag} must be a positive number\n`);
    process.exit(64);
  }
  return n;
};
const connections = positive('connections', values.connections);
const duration = positive('duration', values.duration);
const rate = positive('rate', values.rate);
if (values.redis && !/^redis:\/\/(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?(\/\d+)?$/.test(values.redis)) {
  process.stderr.write('--redis must be a loopback redis:// URL: the bench sends traffic only to this machine\n');
  process.exit(64);
}

const outDir = values.out ?? join(repoRoot, 'bench/results');
const command = `npm run bench -- ${process.argv.slice(2).join(' ')}`;
let failed = 0;
for (const scenario of chosen) {
  const base = values.smoke ? scenario.smoke : scenario.defaults;
  const opts: BenchOptions = {
    connections: connections ?? base.connections,
    duration: duration ?? base.duration,
    rate: rate ?? base.rate,
    redis: values.redis,
    smoke: values.smoke,
  };
  const progress = new Progress(scenario.name, values.quiet);
  const deferred: (() => Promise<unknown> | unknown)[] = [];
  const startedAt = new Date().toISOString();
  progress.say(`${scenario.title} (${opts.connections} connections, ${opts.duration} s, rate ${opts.rate})`);
  let outcome: Outcome = { figures: {}, targets: [], charts: [], notes: [] };
  let error: string | undefined;
  try {
    outcome = await scenario.run({ opts, progress, defer: (fn) => deferred.push(fn) });
  } catch (err) {
    error = (err as Error).stack ?? String(err);
    failed++;
  } finally {
    for (const fn of deferred.reverse()) {
      try {
        await fn();
      } catch (err) {
        progress.say(`clean-up failed: ${(err as Error).message}`);
      }
    }
  }
  const result: ResultFile = {
    scenario: scenario.name,
    title: scenario.title,
    startedAt,
    finishedAt: new Date().toISOString(),
    command,
    options: opts,
    machine: describeMachine(),
    outcome,
    error,
  };
  const files = writeResult(outDir, result);
  if (error) progress.say(`FAILED: ${error}`);
  process.stdout.write(`\n${targetTable(outcome.targets).join('\n')}\n\nreport: ${files.md}\n`);
}
if (!values.out && !values.smoke) {
  updateReadme(
    join(repoRoot, 'bench/README.md'),
    outDir,
    scenarios.map((s) => s.name),
  );
}
process.exit(failed ? 1 : 0);
