// The service compiled for `npm start`: gateway/src/start.ts and everything of `@svc/core` and
// `@svc/db` it imports, in one ES module, dist/start.mjs; npm packages stay imports. Started
// from it, the service loads in a fraction of the time and memory it takes through tsx (no
// transform at load, no esbuild service process, no source maps held). Each inlined file's
// `import.meta.url` is rewritten to that file's own URL, so the paths it computes from it
// (migrations, the runner's bin) are what they are in the source. Rebuilt when older than
// anything it is built from; where it cannot be built (esbuild, a development dependency, is
// absent), `npm start` runs the source through tsx. The bench's target (bench/src/serve.ts) is
// built the same way, by ensureBundle with its own entry.
import { existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs';
import { dirname } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { newest } from '../runner-agent/bundle.mjs';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
export const BUNDLE = here('./dist/start.mjs');
/**
 * The service's other edge processes (src/processes/child.ts), built beside every bundle of the
 * service: a bundle forks it (its SVC_EDGE_CHILD names it) rather than child.ts through tsx.
 */
export const CHILD_BUNDLE = here('./dist/child.mjs');
/** What the service's bundle is built from; another bundle of the service adds its own. */
export const SOURCES = [
  here('./src'),
  here('../core/src'),
  here('../db/src'),
  here('./bundle.mjs'),
  here('../package-lock.json'),
];

/** True when `outfile` exists and nothing of `sources` changed after it. */
function isFresh(outfile, sources) {
  const built = newest(outfile);
  return built > 0 && sources.every((s) => newest(s) <= built);
}

/**
 * Builds the bundle unless it is fresh; false when it cannot be built here (no esbuild, or a
 * checkout this user may not write to, as in the image, which builds it when it is made).
 * `entry`, `outfile` and `sources` make another program of the service's (the bench's target).
 */
export async function ensureBundle({ entry = here('./src/start.ts'), outfile = BUNDLE, sources = SOURCES } = {}) {
  const child = isFresh(CHILD_BUNDLE, SOURCES);
  if (child && isFresh(outfile, sources)) return true;
  try {
    const esbuild = await import('esbuild');
    if (!child) await build(esbuild, here('./src/processes/child.ts'), CHILD_BUNDLE);
    await build(esbuild, entry, outfile);
    return true;
  } catch (err) {
    const why = String(err?.message ?? err).split('\n')[0];
    process.stderr.write(`svc: ${outfile} could not be built (${why}); its source runs through tsx\n`);
    return false;
  }
}

/**
 * The names of the workspace's own packages (@svc/*, svc-runner), from their manifests; the
 * image holds only some of the workspaces.
 */
const WORKSPACE_PACKAGES = new Set(
  JSON.parse(readFileSync(here('../package.json'), 'utf8')).workspaces.flatMap((dir) => {
    const manifest = here(`../${dir}/package.json`);
    return existsSync(manifest) ? [JSON.parse(readFileSync(manifest, 'utf8')).name] : [];
  }),
);
/** The package a bare specifier names: `a` of `a/b`, `@s/a` of `@s/a/b`. */
const packageOf = (specifier) =>
  specifier
    .split('/')
    .slice(0, specifier.startsWith('@') ? 2 : 1)
    .join('/');

/** `import.meta.<field>`, spelled so that this file, bundled into a test, keeps its patterns. */
const meta = (field) => `import.meta.${field}`;

/**
 * What every build of the workspace's TypeScript for plain node shares (this file's bundles,
 * test/run.mjs's of the test files): npm packages stay imports; the workspace's own packages
 * and files are inlined, each file's `import.meta.url`, `dirname` and `filename` rewritten
 * to that file's own.
 */
export const WORKSPACE_BUILD = {
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'esm',
  conditions: ['svc-workspace'],
  logLevel: 'error',
  plugins: [
    {
      name: 'svc-workspace',
      setup(build) {
        build.onResolve({ filter: /^[^./]/ }, (args) =>
          WORKSPACE_PACKAGES.has(packageOf(args.path)) || args.path.startsWith('node:')
            ? undefined
            : { path: args.path, external: true },
        );
        // .mjs too: the plain-JavaScript build helpers (bench/bundle.mjs, this file) that a
        // bundled test imports compute their paths from import.meta.url as well.
        build.onLoad({ filter: /\.(ts|mjs)$/ }, (args) => ({
          contents: readFileSync(args.path, 'utf8')
            .replaceAll(meta('url'), JSON.stringify(pathToFileURL(args.path).href))
            .replaceAll(meta('dirname'), JSON.stringify(dirname(args.path)))
            .replaceAll(meta('filename'), JSON.stringify(args.path)),
          loader: args.path.endsWith('.ts') ? 'ts' : 'js',
        }));
      },
    },
  ],
};

async function build(esbuild, entry, outfile) {
  mkdirSync(dirname(outfile), { recursive: true });
  const staged = `${outfile}.${process.pid}.tmp`;
  await esbuild.build({
    ...WORKSPACE_BUILD,
    entryPoints: [entry],
    outfile: staged,
    define: { SVC_EDGE_CHILD: JSON.stringify(CHILD_BUNDLE) },
  });
  renameSync(staged, outfile);
}
