// `npm start`: installs dependencies when they are missing, then runs every role in one
// process on the embedded defaults (see README). Plain JavaScript so it runs before install.
import { execSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
if (!existsSync(join(root, 'node_modules', 'tsx')) || !existsSync(join(root, 'node_modules', 'uWebSockets.js'))) {
  process.stdout.write('Installing dependencies (npm ci)...\n');
  execSync('npm ci --no-audit --no-fund', { cwd: root, stdio: 'inherit' });
}
process.chdir(root);
(await import('./isolation-tools.mjs')).ensureIsolationTools();
// Local sandboxes' runner-agents start from the compiled bundle when it can be built here.
const runner = await import('../runner-agent/bundle.mjs');
runner.ensureBundle();
// So does the service itself (gateway/bundle.mjs); the source through tsx where it cannot be built.
const service = await import('./bundle.mjs');
let entry = './dist/start.mjs';
if (!(await service.ensureBundle())) {
  const { register } = await import('tsx/esm/api');
  register();
  entry = './src/start.ts';
}
const { runFromEnv } = await import(entry);
await runFromEnv();
