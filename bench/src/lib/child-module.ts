import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

declare const SVC_BENCH_DIST: string | undefined;
/** dist/cli/ when this code runs from the CLI's build (bench/bundle.mjs defines it), else undefined. */
const builtInto = typeof SVC_BENCH_DIST === 'string' ? SVC_BENCH_DIST : undefined;
const SRC = fileURLToPath(new URL('../', import.meta.url));

/**
 * How to run the bench module `module` (a .ts file under bench/src) as a node process of its
 * own: from the build beside the CLI's, made with it (bench/bundle.mjs: ensureCliBundle), when
 * the CLI runs from that build; else the source through tsx. The script to run, and the
 * options node needs before it.
 */
export function benchModule(module: URL | string): { script: string; execArgv: string[] } {
  const path = module instanceof URL ? fileURLToPath(module) : module;
  if (builtInto && path.startsWith(SRC)) {
    return { script: join(builtInto, path.slice(SRC.length).replace(/\.ts$/, '.mjs')), execArgv: [] };
  }
  return { script: path, execArgv: ['--import', 'tsx'] };
}
