/**
 * The receiver-side verifiers README.md prints for Node and for Python's standard library, run
 * as printed: taken out of README.md's Webhooks section at test time, so the copy a reader
 * pastes is the copy that was tested. Each must accept a real signature and answer false,
 * never raise, for a changed body, a stale timestamp and a forged header.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { signWebhook } from '@svc/core';
import t from 'tap';

const README = new URL('../../README.md', import.meta.url);
const SECRET = 'whsec_readme-example';

/** The first fenced block of `lang` after `after` in README.md. */
async function example(lang: string, after: string): Promise<string> {
  const text = await readFile(README, 'utf8');
  const from = text.indexOf(after);
  if (from < 0) throw new Error(`README.md has no "${after}"`);
  const block = new RegExp(`\`\`\`${lang}\\n([\\s\\S]*?)\`\`\``).exec(text.slice(from));
  if (!block) throw new Error(`README.md has no ${lang} block after "${after}"`);
  return block[1] as string;
}

interface Case {
  name: string;
  header: string;
  /** The body as received, base64 (the verifiers take raw bytes). */
  body: string;
  want: boolean;
}

function cases(): Case[] {
  const body = Buffer.from('{"id":"1795746554992776","type":"conversation.turn.done","note":"café"}');
  const now = Math.floor(Date.now() / 1000);
  const valid = signWebhook(SECRET, body, now);
  const b64 = (b: Buffer) => b.toString('base64');
  return [
    { name: 'a valid signature', header: valid, body: b64(body), want: true },
    {
      name: 'a valid v1 beside another scheme, read by name',
      header: `v0=abc, ${valid.replace(',', ', ')}`,
      body: b64(body),
      want: true,
    },
    { name: 'a changed body', header: valid, body: b64(Buffer.concat([body, Buffer.from(' ')])), want: false },
    { name: 'a stale timestamp', header: signWebhook(SECRET, body, now - 301), body: b64(body), want: false },
    { name: 'a non-ASCII v1', header: `t=${now},v1=${'é'.repeat(64)}`, body: b64(body), want: false },
    { name: 'a non-ASCII t', header: `t=${'²'.repeat(3)},v1=${'0'.repeat(64)}`, body: b64(body), want: false },
    { name: 'no pairs at all', header: 'garbage', body: b64(body), want: false },
  ];
}

t.test("README's Node verifier, run as printed", async (t) => {
  const code = await example('js', 'otherwise, Node:');
  const dir = await mkdtemp(join(tmpdir(), 'svc-readme-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, 'verify.mjs');
  await writeFile(file, code);
  const { verifySvcSignature } = (await import(pathToFileURL(file).href)) as {
    verifySvcSignature: (header: string, rawBody: Buffer, secret: string) => boolean;
  };
  for (const c of cases()) {
    let got: unknown;
    try {
      got = verifySvcSignature(c.header, Buffer.from(c.body, 'base64'), SECRET);
    } catch (err) {
      got = `threw ${(err as Error).message}`;
    }
    t.equal(got, c.want, c.name);
  }
});

const python = spawnSync('python3', ['--version']).status === 0;

t.test(
  "README's Python verifier, run as printed",
  { skip: !python && 'python3 is not installed on this machine: the Python example was not run' },
  async (t) => {
    const code = await example('python', 'Python, standard library only:');
    const dir = await mkdtemp(join(tmpdir(), 'svc-readme-'));
    t.teardown(() => rm(dir, { recursive: true, force: true }));
    await writeFile(join(dir, 'verify.py'), code);
    // Each case's answer, or the exception it raised, one JSON value per case.
    await writeFile(
      join(dir, 'run.py'),
      [
        'import base64, json, sys',
        'from verify import verify_svc_signature',
        'out = []',
        'for c in json.load(sys.stdin):',
        '    try:',
        '        out.append(verify_svc_signature(c["header"], base64.b64decode(c["body"]), sys.argv[1]))',
        '    except Exception as e:',
        '        out.append(f"raised {type(e).__name__}: {e}")',
        'print(json.dumps(out))',
      ].join('\n'),
    );
    const all = cases();
    const out = execFileSync('python3', [join(dir, 'run.py'), SECRET], {
      cwd: dir,
      input: JSON.stringify(all),
      encoding: 'utf8',
    });
    const got = JSON.parse(out) as unknown[];
    for (const [i, c] of all.entries()) t.equal(got[i], c.want, c.name);
  },
);
