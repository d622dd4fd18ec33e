import type { ChildProcessByStdio } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { type Confine, type Confined, spawnConfined } from './isolation.ts';
import type { RunAs } from './run-as.ts';

/** A file a runtime reads from its HOME, by its path relative to HOME. */
export interface HomeFile {
  path: string;
  content: string;
}

/**
 * What writes the files: a Node process reading `[{path, content}]` as JSON on stdin, HOME as
 * its argument. Plain JavaScript, as `node -e` runs it.
 */
const WRITER = `
const { mkdirSync, writeFileSync } = require('node:fs');
const { dirname, isAbsolute, relative, resolve } = require('node:path');
const home = process.argv[1];
let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (d) => { input += d; });
process.stdin.on('end', () => {
  for (const f of JSON.parse(input)) {
    const target = resolve(home, f.path);
    const rel = relative(home, target);
    if (rel === '' || rel.startsWith('..') || isAbsolute(rel)) throw new Error(f.path + ' is not a file inside HOME');
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, f.content);
  }
});
`;

/**
 * Writes each file a runtime reads from its HOME (the sandbox directory `home`) before the
 * runtime starts, creating its directories and replacing what is there. The writing is done by
 * a process of the sandbox's user (the `--run-as` user, else the runner's own), so a symbolic
 * link the sandbox placed on the way cannot make the runner write anywhere with rights the
 * sandbox lacks, and the files belong to that user; in an isolated sandbox it runs confined
 * as its other processes do. Rejects, naming the cause, when a path
 * leaves HOME or a file cannot be written; the files before it stay written.
 */
export async function writeHomeFiles(home: string, files: HomeFile[], user?: RunAs, confine?: Confine): Promise<void> {
  if (files.length === 0) return;
  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home };
  const run: Confined = confine
    ? confine(process.execPath, ['-e', WRITER, home], home, env)
    : {
        command: process.execPath,
        args: ['-e', WRITER, home],
        cwd: home,
        ...(user ? { uid: user.uid, gid: user.gid } : {}),
      };
  await new Promise<void>((done, fail) => {
    const child = spawnConfined(run, { env, stdio: ['pipe', 'ignore', 'pipe'] }) as ChildProcessByStdio<
      Writable,
      null,
      Readable
    >;
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    child.on('error', (err) => fail(new Error(`cannot write the runtime's files: ${err.message}`)));
    child.on('exit', (code) => {
      if (code === 0) return done();
      // Node prints the thrown Error's stack; its message line is what says why.
      const why = /^(?:Uncaught )?\w*Error: (.*)$/m.exec(stderr)?.[1] ?? (stderr.trim() || `exit ${code}`);
      fail(new Error(`cannot write the runtime's files: ${why}`));
    });
    child.stdin.on('error', () => {});
    child.stdin.end(JSON.stringify(files));
  });
}
