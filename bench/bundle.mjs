// The bench's target (src/serve.ts: the service, answering the scenarios' calls) compiled as
// `npm start`'s service is (gateway/bundle.mjs), to dist/serve.mjs: it starts in a third of the
// CPU it takes through tsx, which a scenario pays at every fresh service. Plain JavaScript, so
// test/run.mjs can build it once before the bench's smoke files run side by side.
import { renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureBundle, SOURCES, WORKSPACE_BUILD } from '../gateway/bundle.mjs';
import { newest } from '../runner-agent/bundle.mjs';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
export const SERVE = here('./src/serve.ts');
export const SERVE_BUNDLE = here('./dist/serve.mjs');

/** Builds dist/serve.mjs unless it is current; false when it cannot be (serve.ts then runs). */
export function ensureServeBundle() {
  return ensureBundle({
    entry: SERVE,
    outfile: SERVE_BUNDLE,
    sources: [...SOURCES, here('./src'), here('./bundle.mjs')],
  });
}

/**
 * The CLI (src/cli.ts) and the modules its scenarios run in processes of their own (load
 * clients, the publisher, the peers' servers), built together into dist/cli/, each at its
 * path under src/ with .mjs for .ts, their shared code in chunks. Started from it, a smoke
 * run's CLI and each child it forks skip tsx's load (a second of CPU each); the CLI's children
 * find their builds beside it (src/lib/child-module.ts: benchModule).
 */
export const CLI_DIST = here('./dist/cli');
export const CLI_BUNDLE = join(CLI_DIST, 'cli.mjs');
/** Every module under src/ that the CLI's scenarios start as a process of its own. */
const CLI_CHILDREN = [
  'sse/publisher.ts',
  'sse/watcher.ts',
  'clients/runner-fleet.ts',
  'clients/replay-reader.ts',
  'clients/ws-echo.ts',
  'peers/uws-sse-server.ts',
];

/** Builds dist/cli/ unless it is current; false when it cannot be (the CLI then runs through tsx). */
export async function ensureCliBundle() {
  const sources = [...SOURCES, here('./src'), here('./bundle.mjs'), here('../test/src/redis-cluster.ts')];
  const fresh = () => {
    const built = newest(CLI_BUNDLE);
    return built > 0 && sources.every((s) => newest(s) <= built);
  };
  if (fresh()) return true;
  const staged = `${CLI_DIST}.${process.pid}.tmp`;
  try {
    const esbuild = await import('esbuild');
    rmSync(staged, { recursive: true, force: true });
    await esbuild.build({
      ...WORKSPACE_BUILD,
      entryPoints: ['cli.ts', ...CLI_CHILDREN].map((f) => here(`./src/${f}`)),
      outdir: staged,
      outbase: here('./src'),
      outExtension: { '.js': '.mjs' },
      splitting: true,
      define: { SVC_BENCH_DIST: JSON.stringify(CLI_DIST) },
    });
    // Whole or not at all: another run may be starting the CLI from the one there now.
    rmSync(CLI_DIST, { recursive: true, force: true });
    renameSync(staged, CLI_DIST);
    return true;
  } catch (err) {
    rmSync(staged, { recursive: true, force: true });
    if (fresh()) return true; // another run built it meanwhile
    const why = String(err?.message ?? err).split('\n')[0];
    process.stderr.write(`bench: ${CLI_DIST} could not be built (${why}); the CLI runs through tsx\n`);
    return false;
  }
}
