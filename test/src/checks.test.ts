/**
 * The project's own checks run as part of the suite, so CI fails on a type error or a lint
 * finding just as it fails on a broken test.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);

t.test('npm run typecheck passes', async (t) => {
  const res = await run(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.json'], {
    maxBuffer: 16 * 1024 * 1024,
  }).catch((err: { stdout: string; code: number }) => err);
  t.equal('code' in res ? res.code : 0, 0, res.stdout || 'no type errors');
});

t.test('npm run lint passes', async (t) => {
  const res = await run(process.execPath, ['node_modules/@biomejs/biome/bin/biome', 'check', '.'], {
    maxBuffer: 16 * 1024 * 1024,
  }).catch((err: { stdout: string; stderr: string; code: number }) => err);
  t.equal('code' in res ? res.code : 0, 0, 'code' in res ? `${res.stdout}${res.stderr}`.slice(0, 4000) : 'clean');
});
