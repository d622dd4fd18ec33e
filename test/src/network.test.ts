import { execFileSync, spawn } from 'node:child_process';
import { createServer, get, type IncomingHttpHeaders, request, type Server } from 'node:http';
import { type AddressInfo, connect, type Socket } from 'node:net';
import { networkInterfaces } from 'node:os';
import fc from 'fast-check';
import {
  destination,
  type EgressGrant,
  EgressProxy,
  hostAllowed,
  insideAddress,
  installCommands,
  removeCommands,
  removeFirewall,
} from 'svc-runner';
import t, { type Test } from 'tap';
import { startFakeProvider } from './fakes/inference-provider.ts';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import { replyOf, turnSettled } from './scripted-turns.ts';

/** A local HTTP server on `host` that answers `hello from <name>` and counts connections and requests. */
async function startTarget(t: Test, host: string, name: string) {
  const seen: { url: string; headers: IncomingHttpHeaders }[] = [];
  const server: Server = createServer((req, res) => {
    seen.push({ url: req.url ?? '', headers: req.headers });
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`hello from ${name}`);
  });
  const counts = { connections: 0 };
  server.on('connection', () => counts.connections++);
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return {
    port: (server.address() as AddressInfo).port,
    seen,
    get connections() {
      return counts.connections;
    },
  };
}

const basic = (proxyUrl: string) => {
  const u = new URL(proxyUrl);
  return `Basic ${Buffer.from(`${u.username}:${u.password}`).toString('base64')}`;
};

/** A CONNECT through the proxy, then a GET over the tunnel when it is open. */
function viaConnect(
  proxy: EgressProxy,
  auth: string | undefined,
  target: string,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({
      host: '127.0.0.1',
      port: proxy.port,
      method: 'CONNECT',
      path: target,
      headers: auth ? { 'proxy-authorization': auth } : {},
    });
    req.on('connect', (res, socket: Socket, head) => {
      if (res.statusCode !== 200) {
        let body = head.toString();
        socket.on('data', (d) => {
          body += d;
        });
        socket.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        socket.on('error', reject);
        return;
      }
      // No `agent`: an agent would open its own connection instead of using the tunnel.
      get(`http://${target}/through-tunnel`, { createConnection: () => socket }, (r) => {
        if (r.socket !== socket) reject(new Error('the answer did not come through the tunnel'));
        let body = '';
        r.on('data', (d) => {
          body += d;
        });
        r.on('end', () => resolve({ status: 200, body }));
      }).on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** A plain `http://` request in absolute form, as a client sends it to an HTTP proxy. */
function viaAbsolute(proxy: EgressProxy, auth: string | undefined, url: string) {
  return new Promise<{ status: number; body: string }>((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port: proxy.port,
        method: 'GET',
        path: url,
        headers: { host: new URL(url).host, ...(auth ? { 'proxy-authorization': auth } : {}) },
      },
      (res) => {
        let body = '';
        res.on('data', (d) => {
          body += d;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

t.test('allowed_hosts entries match exact hosts, ports and *.subdomains, without case', async (t) => {
  t.ok(hostAllowed(['example.com'], 'example.com', 443));
  t.ok(hostAllowed(['Example.COM'], 'example.com.', 80), 'case and a trailing dot do not matter');
  t.notOk(hostAllowed(['example.com'], 'api.example.com', 443), 'an exact entry is not a wildcard');
  t.notOk(hostAllowed(['example.com'], 'badexample.com', 443));
  t.ok(hostAllowed(['*.example.com'], 'api.example.com', 443));
  t.ok(hostAllowed(['*.example.com'], 'a.b.example.com', 443), 'a wildcard covers any depth');
  t.notOk(hostAllowed(['*.example.com'], 'example.com', 443), 'a wildcard does not cover the domain itself');
  t.notOk(hostAllowed(['*.example.com'], 'evilexample.com', 443));
  t.ok(hostAllowed(['example.com:8443'], 'example.com', 8443));
  t.notOk(hostAllowed(['example.com:8443'], 'example.com', 443), 'an entry with a port allows only that port');
  t.ok(hostAllowed(['[::1]:3000'], '[::1]', 3000));
  t.ok(hostAllowed(['127.0.0.1:3000'], '127.0.0.1', 3000));
  t.notOk(hostAllowed([], 'example.com', 443), 'an empty list allows nothing');
  t.ok(hostAllowed(null, 'anything.test', 1), 'no list allows everything');
});

t.test('property: a wildcard never covers its own domain, and matching ignores case', async (t) => {
  const label = fc.stringMatching(/^[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?$/);
  const domain = fc.array(label, { minLength: 1, maxLength: 4 }).map((l) => l.join('.'));
  fc.assert(
    fc.property(domain, label, fc.integer({ min: 1, max: 65_535 }), (d, sub, port) => {
      if (hostAllowed([`*.${d}`], d, port)) return false;
      if (!hostAllowed([`*.${d}`], `${sub}.${d}`.toUpperCase(), port)) return false;
      if (!hostAllowed([d.toUpperCase()], d, port)) return false;
      return !hostAllowed([d], `${sub}.${d}`, port) && !hostAllowed([`${d}:${port}`], d, (port % 65_535) + 1);
    }),
  );
  t.pass('held for every generated case');
});

t.test('the egress proxy', async (t) => {
  const allowed = await startTarget(t, '127.0.0.2', 'allowed');
  const refused = await startTarget(t, '127.0.0.3', 'refused');
  const refusals: { grant: EgressGrant; host: string; reason: string | undefined }[] = [];
  const proxy = await EgressProxy.start((grant, host, reason) => refusals.push({ grant, host, reason }));
  t.teardown(() => proxy.close());
  const grantOf = (sandbox: string, allowedHosts: string[] | null) =>
    proxy.grant({ sandbox, incarnation: 0, conversationId: `conv_${sandbox}`, allowedHosts });
  const url = grantOf('sbx_a', ['127.0.0.2']);
  const auth = basic(url);
  t.match(url, /^http:\/\/svc:[0-9a-f]{48}@127\.0\.0\.1:\d+$/, 'a proxy URL with its own credential');

  t.test('tunnels CONNECT to an allowed host', async (t) => {
    const res = await viaConnect(proxy, auth, `127.0.0.2:${allowed.port}`);
    t.same(res, { status: 200, body: 'hello from allowed' });
  });

  t.test('forwards a plain http:// request to an allowed host, without the proxy credential', async (t) => {
    const before = allowed.seen.length;
    const res = await viaAbsolute(proxy, auth, `http://127.0.0.2:${allowed.port}/plain?x=1`);
    t.same(res, { status: 200, body: 'hello from allowed' });
    const seen = allowed.seen.slice(before);
    t.equal(seen.length, 1);
    t.equal(seen[0]?.url, '/plain?x=1', 'origin-form path and query upstream');
    t.notOk(seen[0]?.headers['proxy-authorization'], 'the credential stays with the proxy');
  });

  t.test('refuses another host with 403, over CONNECT and plain http, and never contacts it', async (t) => {
    refusals.length = 0;
    const tunnel = await viaConnect(proxy, auth, `127.0.0.3:${refused.port}`);
    t.equal(tunnel.status, 403);
    t.match(tunnel.body, /127\.0\.0\.3 is not in this sandbox's allowed_hosts/);
    const plain = await viaAbsolute(proxy, auth, `http://127.0.0.3:${refused.port}/x`);
    t.equal(plain.status, 403);
    t.match(plain.body, /127\.0\.0\.3 is not in this sandbox's allowed_hosts/);
    t.equal(refused.connections, 0, 'nothing connected to the refused server');
    t.same(
      refusals.map((r) => [r.grant.sandbox, r.grant.conversationId, r.host]),
      [
        ['sbx_a', 'conv_sbx_a', '127.0.0.3'],
        ['sbx_a', 'conv_sbx_a', '127.0.0.3'],
      ],
      'each refusal is reported with whose it was',
    );
  });

  t.test('an entry with a port allows that port only', async (t) => {
    const portUrl = grantOf('sbx_port', [`127.0.0.2:${allowed.port}`]);
    t.equal((await viaConnect(proxy, basic(portUrl), `127.0.0.2:${allowed.port}`)).status, 200);
    t.equal((await viaConnect(proxy, basic(portUrl), `127.0.0.2:${refused.port}`)).status, 403);
  });

  t.test('an empty list refuses everything; no list allows every public host, not the machine', async (t) => {
    const empty = grantOf('sbx_empty', []);
    t.equal((await viaConnect(proxy, basic(empty), `127.0.0.2:${allowed.port}`)).status, 403);
    t.equal((await viaAbsolute(proxy, basic(empty), `http://127.0.0.2:${allowed.port}/`)).status, 403);
    refusals.length = 0;
    const open = grantOf('sbx_open', null);
    const inside = await viaConnect(proxy, basic(open), `127.0.0.3:${refused.port}`);
    t.equal(inside.status, 403, 'the runner’s loopback is not the internet');
    t.match(inside.body, /127\.0\.0\.3 is refused: a private or loopback address/);
    const named = await viaAbsolute(proxy, basic(open), `http://localhost:${refused.port}/`);
    t.equal(named.status, 403, 'nor a name that resolves to it');
    t.equal(refused.connections, 0);
    t.same(
      refusals.map((r) => [r.host, r.reason]),
      [
        ['127.0.0.3', 'a private or loopback address'],
        ['localhost', 'a private or loopback address'],
      ],
    );
    const reached = proxy.grant({
      sandbox: 'sbx_reach',
      incarnation: 0,
      conversationId: 'conv_reach',
      allowedHosts: null,
      reach: [`127.0.0.3:${refused.port}`],
    });
    t.same(
      await viaConnect(proxy, basic(reached), `127.0.0.3:${refused.port}`),
      { status: 200, body: 'hello from refused' },
      'a host the sandbox always reaches (the service, the model provider) is reached',
    );
  });

  t.test('where an unrestricted grant leads', async (t) => {
    const open = { sandbox: 's', incarnation: 0, conversationId: 'c', allowedHosts: null };
    for (const address of [
      '127.0.0.1',
      '10.1.2.3',
      '172.16.0.9',
      '192.168.1.1',
      '169.254.169.254',
      '0.0.0.0',
      '::1',
      'fe80::1',
      'fd00::2',
      '::ffff:127.0.0.1',
      '100.64.0.1',
    ]) {
      t.same(await destination(open, address, 80), { refused: 'a private or loopback address' }, address);
    }
    for (const address of ['93.184.216.34', '1.1.1.1', '2606:4700:4700::1111']) {
      t.same(await destination(open, address, 443), { address }, `${address} is public`);
    }
    t.same(
      await destination({ ...open, allowedHosts: ['10.1.2.3'] }, '10.1.2.3', 80),
      { address: '10.1.2.3' },
      'an allowlist entry naming a private host opens it',
    );
    t.same(await destination({ ...open, allowedHosts: [] }, '1.1.1.1', 80), { refused: 'not in allowed_hosts' });
    t.equal(insideAddress('8.8.8.8'), false);
  });

  t.test('without a known credential it is 407; a sandbox cannot use another’s allowlist', async (t) => {
    t.equal((await viaConnect(proxy, undefined, `127.0.0.2:${allowed.port}`)).status, 407);
    t.equal((await viaAbsolute(proxy, undefined, `http://127.0.0.2:${allowed.port}/`)).status, 407);
    const forged = `Basic ${Buffer.from(`svc:${'0'.repeat(48)}`).toString('base64')}`;
    t.equal((await viaConnect(proxy, forged, `127.0.0.2:${allowed.port}`)).status, 407);
    const other = grantOf('sbx_b', ['127.0.0.3']);
    t.equal((await viaConnect(proxy, basic(other), `127.0.0.2:${allowed.port}`)).status, 403, 'b’s list, not a’s');
    await proxy.revoke('sbx_b');
    t.equal((await viaConnect(proxy, basic(other), `127.0.0.3:${refused.port}`)).status, 407, 'revoked');
    t.equal((await viaConnect(proxy, auth, `127.0.0.2:${allowed.port}`)).status, 200, 'a’s credential still works');
  });

  t.test('property: arbitrary CONNECT lines get an HTTP answer and never reach a refused host', async (t) => {
    const line = fc.string({ maxLength: 80 }).map((x) => x.replace(/[\r\n]/g, ''));
    const target = fc.oneof(
      line,
      fc.constantFrom(`127.0.0.3:${refused.port}`, `127.0.0.2:${allowed.port}`, `[::1]:${refused.port}`),
    );
    const header = fc.oneof(line, fc.constant(auth));
    const before = refused.connections;
    const ask = (request: string) =>
      new Promise<string>((resolve) => {
        const socket = connect(proxy.port, '127.0.0.1');
        let answer = '';
        socket.on('data', (d) => {
          answer += d;
          if (answer.includes('\r\n')) socket.destroy();
        });
        socket.on('close', () => resolve(answer));
        socket.on('error', () => resolve(answer));
        socket.end(request);
      });
    await fc.assert(
      fc.asyncProperty(target, header, async (to, credential) => {
        const answer = await ask(`CONNECT ${to} HTTP/1.1\r\nHost: ${to}\r\nProxy-Authorization: ${credential}\r\n\r\n`);
        return /^HTTP\/1\.1 (200|400|403|407|502) /.test(answer);
      }),
      { numRuns: 150 },
    );
    t.equal(refused.connections, before, 'nothing connected to the refused server');
  });

  t.test('an allowed host that is down is 502, not a hang', async (t) => {
    const res = await viaConnect(proxy, auth, '127.0.0.2:1');
    t.equal(res.status, 502);
    t.match(res.body, /cannot reach/);
  });
});

t.test('the firewall rules accept loopback and reject the rest for the user, IPv4 and IPv6', async (t) => {
  t.same(installCommands(1234), [
    ['iptables', '-A', 'OUTPUT', '-o', 'lo', '-d', '127.0.0.0/8', '-m', 'owner', '--uid-owner', '1234', '-j', 'ACCEPT'],
    ['iptables', '-A', 'OUTPUT', '-m', 'owner', '--uid-owner', '1234', '-j', 'REJECT'],
    ['ip6tables', '-A', 'OUTPUT', '-o', 'lo', '-d', '::1/128', '-m', 'owner', '--uid-owner', '1234', '-j', 'ACCEPT'],
    ['ip6tables', '-A', 'OUTPUT', '-m', 'owner', '--uid-owner', '1234', '-j', 'REJECT'],
  ]);
  t.same(
    removeCommands(1234).map((c) => c.slice(0, 2)),
    [
      ['iptables', '-D'],
      ['iptables', '-D'],
      ['ip6tables', '-D'],
      ['ip6tables', '-D'],
    ],
  );
});

/** The real service and a real svc-runner (`runnerArgs` added) with the scripted agent, on an account with a credential. */
async function startWorld(t: Test, runnerArgs: string[] = []) {
  const provider = await startFakeProvider();
  t.teardown(() => provider.close());
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, ANTHROPIC_BASE_URL: provider.url },
  });
  const { http } = svc;
  const me = await signUp(svc);
  const token = me.key;
  const put = await http.put('/api/account/inference-credentials/anthropic_api_key', {
    token,
    body: { value: 'good-anthropic-key-123456' },
  });
  t.equal(put.status, 200, JSON.stringify(put.body));
  const runnerRow = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const runner = await startRunnerProcess(t, svc.url, runnerRow.token, runnerArgs);

  /** Runs one turn on a new sandbox of an environment with `networking_config`, and returns its events. */
  const converse = async (networking: { allowed_hosts: string[] } | null, prompt: string, setupScript = '') => {
    const env = (
      await http.post('/api/environments', {
        token,
        body: { name: `env ${Math.random()}`, networking_config: networking, setup_script: setupScript },
      })
    ).body;
    const agent = (
      await http.post('/api/agents', {
        token,
        body: {
          name: `coder ${Math.random()}`,
          runtime: 'claude',
          model: 'anthropic/claude-sonnet-4-5',
          environment_id: env.id,
          sandbox_provider: 'runner',
        },
      })
    ).body;
    const res = await http.post('/api/conversations', { token, body: { agent_id: agent.id, prompt } });
    t.equal(res.status, 201, JSON.stringify(res.body));
    const id = res.body.id as string;
    await turnSettled(http, token, id);
    const { events, reply } = await replyOf(http, token, id);
    const network = events.find((e) => e.stage === 'network' && e.state === 'done');
    return {
      events,
      reply,
      network: network?.data ? (JSON.parse(network.data) as Record<string, unknown>) : undefined,
      stderr: events.filter((e) => e.stream === 'stderr').map((e) => e.data ?? ''),
      output: () =>
        `${JSON.stringify(events.filter((e) => e.stream !== 'acp'))}\nreply: ${reply}\nrunner: ${runner.output}`,
    };
  };
  return { svc, provider, converse };
}

t.test('a sandbox reaches its allowed hosts and its model provider, and is refused the rest', async (t) => {
  const allowed = await startTarget(t, '127.0.0.2', 'allowed');
  const refused = await startTarget(t, '127.0.0.3', 'refused');
  const { svc, provider, converse } = await startWorld(t);
  const providerHost = new URL(provider.url).host;
  const allowedUrl = `http://127.0.0.2:${allowed.port}/hello`;
  const refusedUrl = `http://127.0.0.3:${refused.port}/nope`;
  const providerUrl = `${provider.url}/v1/models`;

  const limited = await converse(
    { allowed_hosts: ['127.0.0.2'] },
    `fetch ${allowedUrl} fetch ${refusedUrl} fetch ${refusedUrl} fetch ${providerUrl} fetch direct ${allowedUrl}`,
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell expansion, for bash
    'echo "setup proxy=${HTTPS_PROXY:+set}"',
  );
  t.match(limited.reply, `fetch ${allowedUrl}: 200.`, `the allowed host answers\n${limited.output()}`);
  t.match(limited.reply, `fetch ${refusedUrl}: proxy 403.`, 'the other host is refused by the proxy');
  t.match(limited.reply, new RegExp(`fetch ${providerUrl}: \\d{3}\\.`), 'the model provider is reachable');
  t.notMatch(limited.reply, `fetch ${providerUrl}: proxy`, 'the provider host is never refused');
  t.equal(refused.connections, 0, 'nothing connected to the refused server');
  t.ok(allowed.seen.length >= 1);
  t.same(limited.network?.mode, 'proxy');
  t.same(
    limited.network?.allowed_hosts,
    ['127.0.0.2', providerHost, new URL(svc.url).host],
    'the environment’s list plus the provider’s host and the service’s own',
  );
  t.match(
    limited.reply,
    `fetch direct ${allowedUrl}: error ECONNREFUSED.`,
    'ignoring the proxy reaches nothing: the sandbox’s network holds its own loopback only',
  );
  t.equal(limited.network?.firewall, 'network namespace');
  t.equal(limited.network?.isolation, 'namespaces');
  t.match(limited.network?.note, /loopback only/);
  const stageOrder = limited.events.filter((e) => e.kind === 'stage' && e.state === 'started').map((e) => e.stage);
  t.ok(stageOrder.indexOf('network') < stageOrder.indexOf('setup'), 'network comes before setup');
  t.ok(
    limited.events.some((e) => e.stream === 'stdout' && e.data?.includes('setup proxy=set')),
    'the setup script gets the proxy too',
  );
  const refusalLines = limited.stderr.filter((l) => l.includes('svc-runner: network: refused 127.0.0.3'));
  t.equal(refusalLines.length, 1, 'one stderr line for the refused host in the turn, not one per request');

  const open = await converse(null, `fetch ${refusedUrl} fetch ${providerUrl}`);
  t.match(
    open.reply,
    `fetch ${refusedUrl}: proxy 403.`,
    `no networking_config: unrestricted, but not into the runner’s machine\n${open.output()}`,
  );
  t.match(open.reply, new RegExp(`fetch ${providerUrl}: \\d{3}\\.`), 'the model provider is reachable');
  t.match(open.network, { mode: 'unrestricted', isolation: 'namespaces', firewall: 'network namespace' });
  t.equal(refused.seen.length, 0, 'nothing reached the machine’s other address');

  const empty = await converse({ allowed_hosts: [] }, `fetch ${allowedUrl} fetch ${providerUrl}`);
  t.match(empty.reply, `fetch ${allowedUrl}: proxy 403.`, `an empty list refuses the rest\n${empty.output()}`);
  t.notMatch(empty.reply, `fetch ${providerUrl}: proxy`, 'but still allows the provider');
});

/** An IPv4 address of this machine that is not loopback (the firewall leaves loopback open). */
function outsideAddress(): string | undefined {
  return Object.values(networkInterfaces())
    .flat()
    .find((a) => a && a.family === 'IPv4' && !a.internal)?.address;
}

function haveIptables(): boolean {
  try {
    execFileSync('iptables', ['-w', '-S', 'OUTPUT'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

const RUN_AS_USER = 'svcnettest';

t.test(
  '--run-as --isolation none: runtimes run as the user and a process ignoring the proxy has no route out',
  {
    skip:
      process.getuid?.() !== 0
        ? 'needs root (useradd, processes as another user, iptables)'
        : !haveIptables()
          ? 'iptables cannot list or add rules here'
          : !outsideAddress()
            ? 'no non-loopback address to stand for the outside'
            : false,
  },
  async (t) => {
    try {
      execFileSync('id', ['-u', RUN_AS_USER], { stdio: 'ignore' });
    } catch {
      execFileSync('useradd', ['--system', '--no-create-home', '--shell', '/usr/sbin/nologin', RUN_AS_USER]);
    }
    const uid = Number(execFileSync('id', ['-u', RUN_AS_USER], { encoding: 'utf8' }).trim());
    t.teardown(() => removeFirewall(uid));
    const outside = outsideAddress() as string;
    const target = await startTarget(t, '0.0.0.0', 'outside');
    const { converse } = await startWorld(t, ['--run-as', RUN_AS_USER, '--isolation', 'none']);
    const url = `http://${outside}:${target.port}/x`;

    const limited = await converse(
      { allowed_hosts: [outside] },
      `whoami fetch ${url} fetch direct ${url}`,
      'echo "setup uid=$(id -u)"',
    );
    t.match(limited.reply, `uid ${uid}.`, `the runtime runs as ${RUN_AS_USER}\n${limited.output()}`);
    t.ok(
      limited.events.some((e) => e.stream === 'stdout' && e.data?.includes(`setup uid=${uid}`)),
      'so does the setup script',
    );
    t.same(limited.network, {
      mode: 'proxy',
      allowed_hosts: limited.network?.allowed_hosts,
      firewall: `uid ${uid}`,
      isolation: 'none',
    });
    t.match(limited.reply, `fetch ${url}: 200.`, 'through the proxy the allowed host answers');
    t.match(limited.reply, `fetch direct ${url}: error ECONNREFUSED.`, 'directly, the firewall refuses it');
    const rules = execFileSync('iptables', ['-w', '-S', 'OUTPUT'], { encoding: 'utf8' });
    t.match(rules, `--uid-owner ${uid} -j REJECT`);

    const open = await converse(null, `fetch ${url} fetch direct ${url}`);
    t.match(open.network, { mode: 'unrestricted', firewall: `uid ${uid}`, isolation: 'none', note: /only HTTP\(S\)/ });
    t.match(
      open.reply,
      insideAddress(outside) ? `fetch ${url}: proxy 403.` : `fetch ${url}: 200.`,
      `unrestricted goes out through the proxy, which keeps it off the machine's private networks\n${open.output()}`,
    );
    t.match(open.reply, `fetch direct ${url}: error ECONNREFUSED.`, 'and only through it, as its stage says');
  },
);

t.test('svc-runner refuses a --run-as it cannot honour, saying why', async (t) => {
  const bin = new URL('../../runner-agent/bin/svc-runner.mjs', import.meta.url).pathname;
  const run = (user: string) =>
    new Promise<{ code: number | null; stderr: string }>((resolve) => {
      const child = spawn(
        process.execPath,
        [bin, '--url', 'http://127.0.0.1:9', '--token', 'svcr_x', '--root', '/tmp/svc-net-cli', '--run-as', user],
        { stdio: ['ignore', 'ignore', 'pipe'] },
      );
      let stderr = '';
      child.stderr.on('data', (d) => {
        stderr += d;
      });
      child.on('close', (code) => resolve({ code, stderr }));
    });
  if (process.getuid?.() === 0) {
    t.match(await run('no-such-user-svc'), { code: 2, stderr: /--run-as: no such user no-such-user-svc/ });
    t.match(await run('root'), { code: 2, stderr: /is root; name an unprivileged user/ });
  } else {
    t.match(await run('nobody'), { code: 2, stderr: /--run-as needs the runner to run as root/ });
  }
});
