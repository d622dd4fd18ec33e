#!/usr/bin/env node
// The workspace's svc-runner: runs the TypeScript CLI through tsx, so the service's `local`
// provider and the tests run the source as it is. The published package's `bin` is the
// compiled dist/svc-runner.js (build.mjs); this file is not in the package.
import { register } from 'tsx/esm/api';

register();
await import('../src/cli.ts');
