// Whether dist/svc-runner.js (build.mjs) is the build of the sources as they are now, and a
// way to make it so. The workspace's bin/svc-runner.mjs runs the build when it is current (a
// third of a second to start, against two through tsx) and the TypeScript source otherwise;
// `npm test` and `npm start` build it first when it is missing or older than its sources.
import { execFileSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
export const BUNDLE = here('./dist/svc-runner.js');
// What the bundle inlines: the runner's and core's sources, at the versions the lock pins.
const SOURCES = [
  here('./src'),
  here('../core/src'),
  here('./build.mjs'),
  here('./package.json'),
  here('../package-lock.json'),
];

/** The newest modification time of `path` and everything under it (0 when absent). */
export function newest(path) {
  const stat = statSync(path, { throwIfNoEntry: false });
  if (!stat) return 0;
  if (!stat.isDirectory()) return stat.mtimeMs;
  let max = stat.mtimeMs;
  for (const entry of readdirSync(path)) max = Math.max(max, newest(join(path, entry)));
  return max;
}

/** True when the bundle exists and nothing it is built from changed after it. */
export function bundleIsFresh() {
  const built = statSync(BUNDLE, { throwIfNoEntry: false })?.mtimeMs;
  return built !== undefined && SOURCES.every((s) => newest(s) <= built);
}

/**
 * Builds the bundle unless it is fresh. False when it cannot be built here (esbuild, a
 * development dependency, is absent from a production install): the source then runs.
 */
export function ensureBundle() {
  if (bundleIsFresh()) return true;
  try {
    execFileSync(process.execPath, [here('./build.mjs')], { stdio: 'pipe' });
    return true;
  } catch (err) {
    const why = String(err?.stderr || err?.message || err)
      .trim()
      .split('\n')[0];
    process.stderr.write(
      `svc: the runner-agent bundle could not be built (${why}); runners run its source through tsx\n`,
    );
    return false;
  }
}
