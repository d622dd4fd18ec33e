#!/usr/bin/env node
// The workspace's svc-runner: the compiled dist/svc-runner.js when it is the build of the
// sources as they are (bundle.mjs), else the TypeScript CLI through tsx, so the service's
// `local` provider and the tests always run the source as it is. The published package's `bin`
// is dist/svc-runner.js itself; this file is not in the package.
import { bundleIsFresh } from '../bundle.mjs';

if (bundleIsFresh()) {
  await import('../dist/svc-runner.js');
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../src/cli.ts');
}
