import { execFile } from 'node:child_process';

/**
 * The rules that leave processes of user `uid` no route off the machine: loopback (127.0.0.0/8,
 * ::1, where the runner's proxy listens) is accepted, everything else is rejected (an immediate
 * "connection refused", not a hang). Each rule is the argument list after the action flag, the
 * same for iptables and ip6tables but for the loopback address. Loopback is left open, not
 * only the proxy's port, so a sandbox's own servers (a test suite's, a dev server) still work;
 * a host's address on another interface is not loopback and is rejected.
 */
export function firewallRules(uid: number): { tool: 'iptables' | 'ip6tables'; rule: string[] }[] {
  const owner = ['-m', 'owner', '--uid-owner', String(uid)];
  return [
    { tool: 'iptables', rule: ['OUTPUT', '-o', 'lo', '-d', '127.0.0.0/8', ...owner, '-j', 'ACCEPT'] },
    { tool: 'iptables', rule: ['OUTPUT', ...owner, '-j', 'REJECT'] },
    { tool: 'ip6tables', rule: ['OUTPUT', '-o', 'lo', '-d', '::1/128', ...owner, '-j', 'ACCEPT'] },
    { tool: 'ip6tables', rule: ['OUTPUT', ...owner, '-j', 'REJECT'] },
  ];
}

/** The command lines that install the rules: appended in order, each only when absent (`-C`). */
export function installCommands(uid: number): string[][] {
  return firewallRules(uid).map(({ tool, rule }) => [tool, '-A', ...rule]);
}

/** The command lines that remove the rules. */
export function removeCommands(uid: number): string[][] {
  return firewallRules(uid).map(({ tool, rule }) => [tool, '-D', ...rule]);
}

function run(argv: string[]): Promise<void> {
  const [cmd, ...args] = argv;
  return new Promise((resolve, reject) =>
    execFile(cmd as string, ['-w', ...args], { timeout: 10_000 }, (err, _out, stderr) =>
      err ? reject(new Error(`${argv.join(' ')}: ${stderr.trim() || err.message}`)) : resolve(),
    ),
  );
}

/**
 * Installs the rules for `uid` (each once: a rule already present is not added again) and
 * resolves with what now holds, for the `network` stage: `uid <n>` or `none: <why>`. IPv4 is
 * required; IPv6 rules are best effort (a kernel without IPv6 has nothing to leak through).
 * Rules are appended to OUTPUT: an earlier ACCEPT of the operator's still wins.
 */
export async function installFirewall(uid: number): Promise<string> {
  const notes: string[] = [];
  for (const argv of installCommands(uid)) {
    const check = argv.map((a) => (a === '-A' ? '-C' : a));
    try {
      await run(check);
      continue;
    } catch {
      // absent (or the tool is missing: adding says which)
    }
    try {
      await run(argv);
    } catch (err) {
      if (argv[0] === 'ip6tables') {
        notes.push('no IPv6 rule');
        continue;
      }
      return `none: ${(err as Error).message}`;
    }
  }
  return `uid ${uid}${notes.length ? ` (${[...new Set(notes)].join(', ')})` : ''}`;
}

/** Removes the rules for `uid`; missing rules are not an error. */
export async function removeFirewall(uid: number): Promise<void> {
  for (const argv of removeCommands(uid)) await run(argv).catch(() => {});
}
