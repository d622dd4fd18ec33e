// The bench's target (src/serve.ts: the service, answering the scenarios' calls) compiled as
// `npm start`'s service is (gateway/bundle.mjs), to dist/serve.mjs: it starts in a third of the
// CPU it takes through tsx, which a scenario pays at every fresh service. Plain JavaScript, so
// test/run.mjs can build it once before the bench's smoke files run side by side.
import { fileURLToPath } from 'node:url';
import { ensureBundle, SOURCES } from '../gateway/bundle.mjs';

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
