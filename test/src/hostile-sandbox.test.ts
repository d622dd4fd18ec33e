/**
 * A hostile tenant's agent, on the `local` provider and on a real `svc-runner`: its tool calls
 * (the scripted agent's `run64`, a bash command line as an agent's Bash tool runs it) try to
 * read the instance's files, another sandbox's files and processes and secrets, to reach hosts
 * outside its allowlist by every way round the proxy, and to leave a process behind its
 * runner-agent. Every attempt is refused; a write to its own directory is not.
 */

import { createSocket } from 'node:dgram';
import { chmodSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { startFakeProvider } from './fakes/inference-provider.ts';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { alive, SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import { ranIn, replyOf, run64, turnSettled } from './scripted-turns.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const b64 = (s: string) => Buffer.from(s).toString('base64');
const marker = (name: string) => `${name}-${Math.random().toString(36).slice(2)}`;

/** The pids of this machine's processes whose environment holds `text`. */
function processesWith(text: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/environ`).includes(text)) found.push(Number(entry));
    } catch {
      // gone, or not ours to read
    }
  }
  return found;
}

/**
 * A TCP and a UDP listener on the runner's loopback, and two daemons' Unix sockets that anyone
 * on the machine may connect to (one in /var/lib, where daemons keep them, one in a top-level
 * directory of the operator's), counting what reaches them.
 */
async function startListeners(t: Test) {
  const counts = { tcp: 0, udp: 0, unix: 0 };
  const answer = (s: Socket) => s.end('HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhost!');
  const tcp = createServer((s) => {
    counts.tcp++;
    answer(s);
  });
  await new Promise<void>((resolve) => tcp.listen(0, '127.0.0.1', resolve));
  const udp = createSocket('udp4');
  udp.on('message', () => counts.udp++);
  await new Promise<void>((resolve) => udp.bind(0, '127.0.0.1', resolve));
  const sockets: string[] = [];
  const unix: Server[] = [];
  for (const parent of ['/var/lib', '/srv']) {
    const dir = join(parent, marker('svc-hostile-daemon'));
    mkdirSync(dir, { recursive: true, mode: 0o755 });
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const path = join(dir, 'daemon.sock');
    const server = createServer((s) => {
      counts.unix++;
      answer(s);
    });
    await new Promise<void>((resolve) => server.listen(path, resolve));
    chmodSync(path, 0o777);
    sockets.push(path);
    unix.push(server);
  }
  t.teardown(() => {
    tcp.close();
    udp.close();
    for (const server of unix) server.close();
  });
  return { tcpPort: (tcp.address() as { port: number }).port, udpPort: udp.address().port, sockets, counts };
}

for (const provider of ['local', 'runner'] as const) {
  t.test(`a hostile agent on provider ${provider} is refused everything but its own directory`, async (t) => {
    const model = await startFakeProvider();
    t.teardown(() => model.close());
    const svc = await startTestService(t, {
      backend: primaryBackend(),
      env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, ANTHROPIC_BASE_URL: model.url },
    });
    const { http } = svc;
    const listeners = await startListeners(t);
    // A file of the instance's that anyone on the machine could read: only hiding keeps it.
    const decoy = marker('decoy');
    writeFileSync(join(svc.dataDir, 'decoy.txt'), decoy, { mode: 0o644 });
    // And one in the machine's /tmp, which a sandbox has a private one of.
    const tmpDecoy = join(tmpdir(), `${marker('svc-hostile-decoy')}.txt`);
    writeFileSync(tmpDecoy, decoy, { mode: 0o644 });
    t.teardown(() => rmSync(tmpDecoy, { force: true }));

    const attacker = await signUp(svc);
    const victim = provider === 'local' ? await signUp(svc) : attacker;
    let runner: Awaited<ReturnType<typeof startRunnerProcess>> | undefined;
    if (provider === 'runner') {
      const row = (await http.post('/api/runners', { token: attacker.key, body: { name: 'box' } })).body;
      runner = await startRunnerProcess(t, svc.url, row.token);
      writeFileSync(join(runner.root, 'decoy.txt'), decoy, { mode: 0o644 });
    }
    const launch = async (
      who: { key: string },
      prompt: string,
      env: { env_vars?: Record<string, string>; setup_script?: string } = {},
      vault?: Record<string, string>,
    ) => {
      const token = who.key;
      await http.put('/api/account/inference-credentials/anthropic_api_key', {
        token,
        body: { value: 'sk-ant-test-credential-123456' },
      });
      const environment = (await http.post('/api/environments', { token, body: { name: marker('env'), ...env } })).body;
      const agent = (
        await http.post('/api/agents', {
          token,
          body: {
            name: marker('agent'),
            runtime: 'claude',
            model: 'anthropic/claude-sonnet-4-5',
            environment_id: environment.id,
            ...(provider === 'runner' ? { sandbox_provider: 'runner' } : {}),
          },
        })
      ).body;
      let vaultId: string | undefined;
      if (vault) {
        vaultId = (await http.post('/api/vaults', { token, body: { name: marker('vault') } })).body.id;
        for (const [key, value] of Object.entries(vault)) {
          await http.post(`/api/vaults/${vaultId}/secrets`, { token, body: { key, value } });
        }
      }
      const res = await http.post('/api/conversations', {
        token,
        body: { agent_id: agent.id, prompt, ...(vaultId ? { vault_id: vaultId } : {}) },
      });
      t.equal(res.status, 201, JSON.stringify(res.body));
      const conversation = (await http.get(`/api/conversations/${res.body.id}`, { token })).body;
      return { id: res.body.id as string, sandboxId: conversation.sandbox_id as string };
    };
    const sandboxDirOf = (accountId: string, sandboxId: string) =>
      provider === 'local'
        ? join(svc.dataDir, 'local-sandboxes', accountId, 'sandboxes', sandboxId)
        : join(runner?.root ?? '', 'sandboxes', sandboxId);

    // The victim: a vault secret and an environment secret in its runtime's environment, a file
    // in its sandbox, its runtime kept running while the attacker works.
    const vaultSecret = marker('vault-secret');
    const envSecret = marker('env-secret');
    const victimConv = await launch(
      victim,
      'keep talking',
      { env_vars: { VICTIM_ENV: envSecret }, setup_script: `echo ${marker('victim-file')} > victim.txt` },
      { VICTIM_VAULT: vaultSecret },
    );
    t.equal(await turnSettled(http, victim.key, victimConv.id), 'done', 'the victim’s turn answered and keeps talking');
    const victimDir = sandboxDirOf(victim.accountId, victimConv.sandboxId);
    t.ok(readFileSync(join(victimDir, 'victim.txt'), 'utf8').startsWith('victim-file'), 'the victim’s file is there');

    const mark = marker('hostile-mark');
    const attacks: [string, string][] = [
      ['read the instance’s data directory', `cat ${svc.dataDir}/decoy.txt; ls -A ${svc.dataDir}`],
      [
        'read a file beside the sandboxes',
        runner ? `cat ${runner.root}/decoy.txt` : `ls -A ${svc.dataDir}/local-sandboxes`,
      ],
      ['read the victim’s file', `cat ${victimDir}/victim.txt`],
      ['write into the victim’s sandbox', `echo pwned > ${victimDir}/pwned && echo wrote`],
      [
        // The patterns travel encoded, so that no command line of its own holds them.
        'read secrets from other processes',
        `echo ${b64([vaultSecret, envSecret, 'svcr_', 'MASTER_KEY'].join('\n'))} | base64 -d > /tmp/p; grep -a -l -f /tmp/p /proc/[0-9]*/environ /proc/[0-9]*/cmdline; ls /proc | grep -c '^[0-9]'`,
      ],
      ['a raw TCP socket to the machine', `exec 3<>/dev/tcp/127.0.0.1/${listeners.tcpPort} && echo connected`],
      ['curl ignoring the proxy', `curl -sS --max-time 3 --noproxy '*' http://127.0.0.1:${listeners.tcpPort}/`],
      [
        'the machine’s loopback through the proxy',
        `curl -sS --max-time 3 -x "$HTTP_PROXY" -o /dev/null -w '%{http_code}' http://127.0.0.2:${listeners.tcpPort}/`,
      ],
      ['UDP to the machine', `echo hi > /dev/udp/127.0.0.1/${listeners.udpPort}; echo sent`],
      ['a user namespace of its own', 'unshare -U true && echo unshared'],
      ['what it is', `id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; ls -A /root | wc -l`],
      ['its own directory', 'echo mine > own.txt && cat own.txt && pwd'],
      ['the machine’s /tmp', `cat ${tmpDecoy}; ls -A /tmp | grep -c svc-hostile-decoy`],
      ['a process left behind', 'setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo started'],
      [
        'a daemon’s Unix socket',
        listeners.sockets.map((s) => `curl -sS --max-time 3 --unix-socket ${s} http://daemon/; echo`).join('; '),
      ],
      [
        // The kernel's keyrings are not namespaced; io_uring has been a way into the kernel.
        'the kernel’s keyrings and io_uring',
        `perl -e 'my $r = syscall(${process.arch === 'arm64' ? 219 : 250}, 0, -3, 0); print "keyctl $r $!\\n"; my $p = "\\0" x 120; $r = syscall(425, 1, $p); print "io_uring $r $!\\n"'`,
      ],
    ];
    const attack = await launch(attacker, run64(attacks.map(([, line]) => line)), {
      env_vars: { HOSTILE_MARK: mark },
    });
    t.equal(await turnSettled(http, attacker.key, attack.id), 'done');
    const { reply, events } = await replyOf(http, attacker.key, attack.id);
    const said = ranIn(reply);
    t.equal(
      said.length,
      attacks.length,
      `every attack ran\n${JSON.stringify(events.filter((e) => e.stream !== 'acp'))}`,
    );
    const out = (i: number) => said[i]?.out ?? '';
    const why = (i: number) => `${attacks[i]?.[0]}: ${JSON.stringify(said[i])}`;

    t.notMatch(out(0), decoy, why(0));
    t.notMatch(out(0), 'decoy.txt', 'the data directory is empty to it');
    t.notMatch(out(1), runner ? decoy : victim.accountId, why(1));
    t.not(said[2]?.code, 0, why(2));
    t.notMatch(out(2), 'victim-file', why(2));
    t.notMatch(out(3), 'wrote', why(3));
    t.throws(() => readFileSync(join(victimDir, 'pwned')), 'nothing was written into the victim’s sandbox');
    t.notMatch(out(4), /environ|cmdline/, `no other process’s secrets: ${why(4)}`);
    t.ok(Number(out(4).trim().split('\n').pop()) < 10, `it sees a handful of processes, its own: ${why(4)}`);
    t.notMatch(out(5), 'connected', why(5));
    t.notMatch(out(6), 'host!', why(6));
    t.match(out(7), '403', why(7));
    t.match(out(8), 'sent', 'the datagram went nowhere');
    t.notMatch(out(9), 'unshared', why(9));
    t.match(out(10), /^65534\n/, `it runs as nobody: ${why(10)}`);
    t.match(out(10), /CapEff:\s+0+\n/, 'with no capabilities');
    t.match(out(10), /NoNewPrivs:\s+1\n/, 'and no_new_privs');
    t.match(out(10), /Seccomp:\s+2\n/, 'under a seccomp filter');
    t.match(out(10), /\n0\n$/, 'the service’s HOME is empty to it');
    const ownDir = sandboxDirOf(attacker.accountId, attack.sandboxId);
    t.match(out(11), `mine\n${ownDir}`, why(11));
    t.equal(readFileSync(join(ownDir, 'own.txt'), 'utf8'), 'mine\n', 'its own file is on the machine');
    await sleep(200);
    t.notMatch(out(14), 'host!', why(14));
    t.match(out(15), /^keyctl -1 Operation not permitted\nio_uring -1 Function not implemented\n$/, why(15));
    t.same(listeners.counts, { tcp: 0, udp: 0, unix: 0 }, 'nothing reached the machine’s listeners');
    const stderr = events.filter((e) => e.stream === 'stderr').map((e) => e.data ?? '');
    t.ok(
      stderr.some((l) => l.includes('svc-runner: network: refused 127.0.0.2 (a private or loopback address)')),
      `the proxy’s refusal is in the log\n${stderr.join('')}`,
    );

    t.notMatch(out(12), decoy, why(12));
    t.match(out(12), /(^|\n)0\n$/, 'the machine’s /tmp is not its /tmp');
    t.match(out(13), 'started', why(13));
    t.ok(processesWith(mark).length >= 2, 'its runtime and the process it left run');
    const runnerPid =
      provider === 'local' ? svc.local.held().find((h) => h.sandboxId === attack.sandboxId)?.pid : runner?.child.pid;
    t.ok(alive(runnerPid), 'its runner-agent runs');
    process.kill(runnerPid as number, 'SIGKILL');
    let left = processesWith(mark);
    for (let i = 0; i < 100 && left.length > 0; i++) {
      await sleep(50);
      left = processesWith(mark);
    }
    t.same(left, [], 'after kill -9 of its runner-agent, nothing it started is left');
  });
}
