// The files a runtime reads from its HOME (turn.start `home_files`), as the runner writes them.
import { execFileSync } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { writeHomeFiles } from '../../runner-agent/src/home-files.ts';

const home = (t: Test) => {
  const dir = mkdtempSync(join(tmpdir(), 'svc-home-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
};

t.test('the files are written under HOME, their directories made, what was there replaced', async (t) => {
  const dir = home(t);
  mkdirSync(join(dir, '.gemini'));
  await writeHomeFiles(dir, [{ path: '.gemini/GEMINI.md', content: 'old' }]);
  await writeHomeFiles(dir, [
    { path: '.gemini/GEMINI.md', content: 'Be brief.' },
    { path: '.svc/deep/system-prompt.md', content: 'Sign as "Captain".\n' },
  ]);
  t.equal(readFileSync(join(dir, '.gemini/GEMINI.md'), 'utf8'), 'Be brief.');
  t.equal(readFileSync(join(dir, '.svc/deep/system-prompt.md'), 'utf8'), 'Sign as "Captain".\n');
});

t.test('a path that leaves HOME is refused, naming it', async (t) => {
  const dir = home(t);
  await t.rejects(
    writeHomeFiles(dir, [{ path: '../escaped.md', content: 'x' }]),
    /cannot write the runtime's files: \.\.\/escaped\.md is not a file inside HOME/,
  );
  t.notOk(existsSync(join(dir, '..', 'escaped.md')), 'nothing was written outside');
});

const root = process.getuid?.() === 0;
t.test(
  'with --run-as the files are written by that user, so a symbolic link cannot lead the runner elsewhere',
  { skip: root ? false : 'needs root (processes as another user)' },
  async (t) => {
    const dir = home(t);
    const uid = Number(execFileSync('id', ['-u', 'nobody'], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', 'nobody'], { encoding: 'utf8' }).trim());
    chownSync(dir, uid, gid);
    await writeHomeFiles(dir, [{ path: '.gemini/GEMINI.md', content: 'Be brief.' }], { name: 'nobody', uid, gid });
    t.equal(statSync(join(dir, '.gemini/GEMINI.md')).uid, uid, "the file is the sandbox user's");
    t.equal(statSync(join(dir, '.gemini')).uid, uid, 'and so is its directory');

    // The sandbox points a directory of its HOME at one only root may write.
    const guarded = mkdtempSync(join(tmpdir(), 'svc-guarded-'));
    t.teardown(() => rmSync(guarded, { recursive: true, force: true }));
    symlinkSync(guarded, join(dir, '.svc'));
    await t.rejects(
      writeHomeFiles(dir, [{ path: '.svc/system-prompt.md', content: 'x' }], { name: 'nobody', uid, gid }),
      /cannot write the runtime's files: .*EACCES/,
    );
    t.notOk(existsSync(join(guarded, 'system-prompt.md')), 'nothing was written through the link');
  },
);
