// Compiles the published `svc-runner` into one JavaScript file, dist/svc-runner.js, that Node 20
// runs as it is: src/cli.ts and everything it imports (the protocol code of `@svc/core`, zod,
// the ACP SDK at its pinned version, msgpackr) inlined, so an install fetches one small
// dependency (`ws`) instead of some 18 MB of packages mostly unused here. msgpackr has an
// optional native addon (msgpackr-extract); inlined, msgpackr never finds it and uses its
// JavaScript decoder, so an installed runner holds no native module and runs no install script.
// The license texts of what was inlined go beside it, in dist/THIRD_PARTY_LICENSES.txt.
// Run by `npm run build` (here and at the root) and before `npm pack`.
import { mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const packageRoot = here('.');

// Each file is written beside its place and renamed into it, so a runner starting meanwhile
// (tests build while others run) finds the old file or the new one, never half of one.
mkdirSync(here('./dist'), { recursive: true });
const staged = here(`./dist/svc-runner.js.${process.pid}.tmp`);
const { metafile } = await build({
  absWorkingDir: packageRoot,
  entryPoints: [here('./src/cli.ts')],
  outfile: staged,
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'esm',
  external: ['ws', 'msgpackr-extract'],
  banner: { js: '#!/usr/bin/env node' },
  metafile: true,
  logLevel: 'warning',
});

/** The directory of the npm package a bundled input file belongs to, if it came from node_modules. */
function packageDirOf(input) {
  const match = /^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(input);
  return match ? join(packageRoot, match[1]) : undefined;
}
const packages = [...new Set(Object.keys(metafile.inputs).map(packageDirOf).filter(Boolean))].sort();
const notices = packages.map((dir) => {
  const { name, version, license } = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  const file = readdirSync(dir).find((f) => /^(licen[cs]e|copying)/i.test(f));
  const text = file ? readFileSync(join(dir, file), 'utf8').trim() : `License: ${license}`;
  return `${name}@${version} (${license})\n\n${text}\n`;
});
renameSync(staged, here('./dist/svc-runner.js'));
const licenses = here(`./dist/THIRD_PARTY_LICENSES.txt.${process.pid}.tmp`);
writeFileSync(
  licenses,
  `svc-runner inlines these packages into dist/svc-runner.js.\n\n${notices.join(`\n${'-'.repeat(72)}\n\n`)}`,
);
renameSync(licenses, here('./dist/THIRD_PARTY_LICENSES.txt'));
