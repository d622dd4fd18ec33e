/**
 * Closing a confined runtime is as gentle as closing a plain one: its processes get SIGTERM and
 * their time (a runtime writes its session files then) before the sandbox is killed.
 */
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AcpRuntime, Isolation } from 'svc-runner';
import t from 'tap';
import { SCRIPTED_AGENT_ARGV } from './runner-process.ts';

const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

t.test('a confined runtime gets SIGTERM and its time when it is closed', async (t) => {
  const root = mkdtempSync(join(tmpdir(), 'svc-confined-close-'));
  t.teardown(() => rmSync(root, { recursive: true, force: true }));
  const isolation = await Isolation.probe({ mode: 'namespaces', root });
  t.equal(isolation.unavailable, undefined, 'this machine isolates sandboxes');
  const dir = join(root, 'sandboxes', 'sbx_close');
  mkdirSync(dir, { recursive: true });
  // The sandbox's user finds its directory, as under a runner's root.
  chmodSync(root, 0o711);
  chmodSync(join(root, 'sandboxes'), 0o711);
  if (isolation.user) chownSync(dir, isolation.user.uid, isolation.user.gid);
  const confine = isolation.confinement(dir, undefined);
  // The runtime's command: a shell that tidies up on SIGTERM, around the scripted ACP agent
  // (given the shell's stdin: a background job's is /dev/null otherwise).
  const agent = SCRIPTED_AGENT_ARGV.map(quote).join(' ');
  const runtime = await AcpRuntime.start({
    command: 'bash',
    args: ['-c', `trap 'echo tidied > left.txt; exit 0' TERM; ${agent} <&0 & wait`],
    commandFiles: SCRIPTED_AGENT_ARGV.filter((a) => a.startsWith('/')),
    cwd: dir,
    env: {},
    confine,
    onUpdate: () => {},
    onStderr: () => {},
    onPermission: async () => ({ outcome: 'selected', optionId: 'allow' }),
  });
  t.match(runtime.sessionId, /^sess_/, 'the agent answered through the shell');
  await runtime.close();
  t.equal(readFileSync(join(dir, 'left.txt'), 'utf8'), 'tidied\n', 'its SIGTERM handler ran before the sandbox ended');
});
