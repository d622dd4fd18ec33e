// `npm run demo`: installs dependencies when they are missing (Claude Code's ACP adapter is a
// dependency of the gateway, which ships it), then runs an agent turn end to end against a local
// stand-in for the model provider (see README). Plain JavaScript so it runs before install.
import { execSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const needed = ['tsx', 'uWebSockets.js', 'eventsource', join('@zed-industries', 'claude-agent-acp')];
if (!needed.every((name) => existsSync(join(root, 'node_modules', name)))) {
  process.stdout.write('Installing dependencies (npm ci)...\n');
  execSync('npm ci --no-audit --no-fund', { cwd: root, stdio: 'inherit' });
}
process.chdir(root);
(await import('../gateway/isolation-tools.mjs')).ensureIsolationTools();
const { register } = await import('tsx/esm/api');
register();
const { runDemo } = await import('./src/demo/demo.ts');
await runDemo(process.env);
