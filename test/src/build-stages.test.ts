import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { pathInside } from '../../runner-agent/src/clone.ts';
import { runStreamed } from '../../runner-agent/src/run-streamed.ts';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import type { WireEvent } from './sse-client.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const GIT_TOKEN = 'ghp_build-stages-token-0123456789';
const SKILL = '---\nname: notes\ndescription: Keeps notes.\n---\nWrite notes to NOTES.md.\n';

/**
 * Git repositories served over git's smart HTTP protocol (`git http-backend` as CGI, as a code
 * host serves them), with no internet: `/tools.git` is public; `/private/tools.git` answers
 * only basic auth with user `x-access-token` and GIT_TOKEN, and records the Authorization
 * headers it saw.
 */
async function gitHost(t: Test) {
  const dir = mkdtempSync(join(tmpdir(), 'svc-git-host-'));
  const work = join(dir, 'work');
  mkdirSync(join(work, 'skills', 'review'), { recursive: true });
  writeFileSync(join(work, 'hello.txt'), 'hello from the repository\n');
  writeFileSync(join(work, 'skills', 'review', 'SKILL.md'), '---\nname: review\ndescription: Reviews.\n---\nReview.\n');
  const git = (cwd: string, ...args: string[]) =>
    execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@example.com', ...args], { cwd, stdio: 'pipe' });
  git(work, 'init', '-q', '-b', 'main');
  git(work, 'add', '.');
  git(work, 'commit', '-q', '-m', 'first');
  for (const at of ['tools.git', 'private/tools.git']) git(dir, 'clone', '-q', '--bare', work, at);
  const authorizations: string[] = [];
  const expected = `Basic ${Buffer.from(`x-access-token:${GIT_TOKEN}`).toString('base64')}`;
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname.startsWith('/private/')) {
      authorizations.push(req.headers.authorization ?? '');
      if (req.headers.authorization !== expected) {
        res.writeHead(401, { 'www-authenticate': 'Basic realm="git"' }).end();
        return;
      }
    }
    const cgi = spawn('git', ['http-backend'], {
      env: {
        PATH: process.env.PATH ?? '',
        GIT_PROJECT_ROOT: dir,
        GIT_HTTP_EXPORT_ALL: '1',
        REQUEST_METHOD: req.method ?? 'GET',
        PATH_INFO: decodeURIComponent(url.pathname),
        QUERY_STRING: url.search.slice(1),
        CONTENT_TYPE: req.headers['content-type'] ?? '',
        ...(req.headers['content-encoding'] ? { HTTP_CONTENT_ENCODING: req.headers['content-encoding'] } : {}),
        ...(req.headers['git-protocol'] ? { GIT_PROTOCOL: String(req.headers['git-protocol']) } : {}),
      },
    });
    req.pipe(cgi.stdin);
    const chunks: Buffer[] = [];
    cgi.stdout.on('data', (d: Buffer) => chunks.push(d));
    cgi.on('close', () => {
      // A CGI answer: header lines, a blank line, the body.
      const out = Buffer.concat(chunks);
      const split = out.indexOf('\r\n\r\n');
      const headers = out.subarray(0, split).toString().split('\r\n');
      let status = 200;
      for (const h of headers) {
        const [name, ...rest] = h.split(':');
        const value = rest.join(':').trim();
        if (name?.toLowerCase() === 'status') status = Number.parseInt(value, 10);
        else if (name) res.setHeader(name, value);
      }
      res.writeHead(status).end(out.subarray(split + 4));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, authorizations };
}

/** Whether the npm registry answers (the only internet this suite may have). */
async function registryReachable(): Promise<boolean> {
  try {
    const res = await fetch('https://registry.npmjs.org/semver/7.6.3', { signal: AbortSignal.timeout(10_000) });
    return res.ok;
  } catch {
    return false;
  }
}

t.test('a sandbox build clones, installs and sets up, and the runtime gets skills and MCP servers', async (t) => {
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    env: { RUNNER_HEARTBEAT_MS: '500', RUNNER_GRACE_MS: '1500', RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND },
  });
  const { http } = svc;
  const token = (await signUp(svc)).key;
  const host = await gitHost(t);
  const npm = await registryReachable();
  t.equal(
    (
      await http.put('/api/account/inference-credentials/anthropic_api_key', {
        token,
        body: { value: 'sk-ant-test-credential-123456' },
      })
    ).status,
    200,
  );
  const runnerRow = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const runner = await startRunnerProcess(t, svc.url, runnerRow.token);

  const feed = async (id: string) =>
    (await http.get(`/api/conversations/${id}/events?limit=1000&blocks=true`, { token })).body.data as WireEvent[];
  /** Launches `agent` with `prompt` and waits for its first turn to end; its events and turn. */
  const launchAndSettle = async (agentId: string, prompt: string) => {
    const res = await http.post('/api/conversations', { token, body: { agent_id: agentId, prompt } });
    t.equal(res.status, 201, JSON.stringify(res.body));
    const id = res.body.id as string;
    for (let i = 0; i < 1200; i++) {
      const turns = (await http.get(`/api/conversations/${id}/turns`, { token })).body.data;
      if (turns[0] && turns[0].state !== 'running') {
        // The runner's last events may trail the turn's record by a moment.
        await sleep(200);
        return { id, sandboxId: res.body.sandbox_id as string, turn: turns[0], events: await feed(id) };
      }
      await sleep(50);
    }
    throw new Error(`the turn did not end\n${runner.output}`);
  };
  const stagesOf = (events: WireEvent[]) =>
    events.filter((e) => e.kind === 'stage' && e.stage !== 'request').map((e) => `${e.stage} ${e.state}`);
  const output = (events: WireEvent[], stream: string) =>
    events
      .filter((e) => e.stream === stream)
      .map((e) => e.data)
      .join('');
  const replyOf = (events: WireEvent[]) =>
    events
      .flatMap((e) => e.blocks ?? [])
      .filter((b) => b.kind === 'text')
      .map((b) => b.body)
      .join('');
  // The git host stands for a public one but is on this machine's loopback, which an isolated
  // sandbox reaches only where an allowlist names it (with the npm registry).
  const environment = async (body: object) => {
    const networking_config = { allowed_hosts: [new URL(host.url).host, 'registry.npmjs.org'] };
    const res = await http.post('/api/environments', { token, body: { networking_config, ...body } });
    t.equal(res.status, 201, JSON.stringify(res.body));
    return res.body.id as string;
  };
  let agents = 0;
  const agent = async (environmentId: string, extra: object = {}) => {
    const res = await http.post('/api/agents', {
      token,
      body: {
        name: `builder ${++agents}`,
        runtime: 'claude',
        model: 'anthropic/claude-sonnet-4-5',
        environment_id: environmentId,
        sandbox_provider: 'runner',
        ...extra,
      },
    });
    t.equal(res.status, 201, JSON.stringify(res.body));
    return res.body.id as string;
  };

  t.test('every stage in order; repositories, packages, skills and MCP servers are where they belong', async (t) => {
    if (!npm) t.comment('the npm registry is unreachable: the npm package part of this test is skipped');
    const envId = await environment({
      name: 'full',
      repositories: [
        { url: `${host.url}/tools.git`, mount_path: 'src/tools' },
        { url: `${host.url}/private/tools.git`, mount_path: 'private' },
      ],
      packages: npm ? { npm: ['semver@7.6.3'] } : {},
      setup_script: [
        'cat src/tools/hello.txt',
        'echo "private: $(cat private/hello.txt)"',
        npm ? 'echo "semver says $(semver -i minor 1.2.3)"' : 'true',
      ].join('\n'),
    });
    t.equal(
      (await http.post(`/api/environments/${envId}/secrets`, { token, body: { key: 'GIT_TOKEN', value: GIT_TOKEN } }))
        .status,
      201,
    );
    const agentId = await agent(envId, {
      skills: [{ name: 'notes', content: SKILL }, { source: `${host.url}/tools.git` }],
      mcp_servers: { files: { command: 'node', args: ['files-server.js', '--root', '.'] } },
    });
    const { turn, events } = await launchAndSettle(agentId, 'show mcp and show skills and which semver');
    t.equal(turn.state, 'done', `runner said: ${runner.output}\n${JSON.stringify(events.slice(-5))}`);
    t.same(
      stagesOf(events),
      [
        'sandbox started',
        'provision started',
        'provision done',
        'network started',
        'network done',
        'broker started',
        'broker done',
        'clone started',
        'clone done',
        ...(npm ? ['packages started', 'packages done'] : []),
        'setup started',
        'setup done',
        'sandbox done',
        'turn started',
        'session started',
        'session done',
        'turn done',
      ],
      'the stages, in order',
    );
    for (const e of events.filter((e) => e.kind === 'stage' && e.state === 'done')) {
      t.ok(typeof e.duration_ms === 'number' && e.duration_ms >= 0, `${e.stage} done carries duration_ms`);
    }
    const stdout = output(events, 'stdout');
    t.match(stdout, /^hello from the repository$/m, 'the public repository is at its mount_path');
    t.match(stdout, /^private: hello from the repository$/m, 'the private one too, cloned with GIT_TOKEN');
    t.ok(host.authorizations.includes(`Basic ${Buffer.from(`x-access-token:${GIT_TOKEN}`).toString('base64')}`));
    t.match(output(events, 'stderr'), /Cloning into/, "git's progress is streamed");
    if (npm) t.match(stdout, /^semver says 1\.3\.0$/m, "the npm package's binary is on the setup script's PATH");
    const reply = replyOf(events);
    t.match(
      reply,
      'mcp servers: [{"name":"files","command":"node","args":["files-server.js","--root","."],"env":[]}].',
      'the MCP servers reached session/new',
    );
    t.match(reply, 'skills: notes/SKILL.md, review/SKILL.md.', 'the inline skill and the one from a source');
    if (npm) t.match(reply, /which semver: \/\S+\/sandboxes\/sbx_\w+\/\.svc\/npm\/node_modules\/\.bin\/semver\./);
    t.notMatch(stdout + output(events, 'stderr') + reply, GIT_TOKEN, 'the token never reaches the log');
  });

  t.test('a repository that cannot be cloned fails the build visibly: clone, sandbox and turn failed', async (t) => {
    const envId = await environment({
      name: 'bad-repo',
      repositories: [{ url: `${host.url}/missing.git`, mount_path: 'src/missing' }],
      setup_script: 'echo should not run',
    });
    const { turn, events, sandboxId } = await launchAndSettle(await agent(envId), 'hello');
    t.same(stagesOf(events), [
      'sandbox started',
      'provision started',
      'provision done',
      'network started',
      'network done',
      'broker started',
      'broker done',
      'clone started',
      'clone failed',
      'sandbox failed',
      'turn started',
      'turn failed',
    ]);
    const failed = events.find((e) => e.stage === 'clone' && e.state === 'failed');
    t.match(failed?.data, `cloning ${host.url}/missing.git failed: git clone exited with 128`);
    t.match(failed?.data, /not found/, "git's own reason is quoted");
    t.ok(typeof failed?.duration_ms === 'number', 'the failed stage carries duration_ms');
    t.match(events.find((e) => e.stage === 'sandbox' && e.state === 'failed')?.data, /cloning .*missing\.git failed/);
    t.equal(turn.state, 'failed');
    t.notMatch(output(events, 'stdout'), /should not run/, 'the setup script did not run');
    const sandbox = (await http.get(`/api/sandboxes/${sandboxId}`, { token })).body;
    t.equal(sandbox.status, 'failed');
    t.match(
      turn.error,
      { code: 'sandbox_failed', message: /^The sandbox could not be built: .*missing\.git/ },
      'its record says why',
    );
  });

  t.test('apt packages on a runner not started with --allow-apt: packages failed, naming them and why', async (t) => {
    const envId = await environment({ name: 'apt', packages: { apt: ['cowsay', 'jq=1.6-2'] } });
    const { turn, events } = await launchAndSettle(await agent(envId), 'hello');
    t.same(stagesOf(events), [
      'sandbox started',
      'provision started',
      'provision done',
      'network started',
      'network done',
      'broker started',
      'broker done',
      'packages started',
      'packages failed',
      'sandbox failed',
      'turn started',
      'turn failed',
    ]);
    t.equal(
      events.find((e) => e.stage === 'packages' && e.state === 'failed')?.data,
      'this runner may not install apt packages (cowsay, jq=1.6-2): start svc-runner with --allow-apt, as root or with passwordless sudo',
    );
    t.equal(turn.state, 'failed');
  });
});

t.test('a mount_path must name a new directory inside the sandbox, also past symbolic links', async (t) => {
  const sandbox = mkdtempSync(join(tmpdir(), 'svc-mount-'));
  const outside = mkdtempSync(join(tmpdir(), 'svc-outside-'));
  symlinkSync(outside, join(sandbox, 'link'));
  mkdirSync(join(sandbox, 'taken'));
  t.equal(await pathInside(sandbox, 'src/tools'), join(sandbox, 'src', 'tools'), 'a new directory, parents created');
  await t.rejects(pathInside(sandbox, 'link/repo'), /leads outside the sandbox through a symbolic link/);
  await t.rejects(pathInside(sandbox, 'link/deeper/repo'), /leads outside the sandbox/);
  await t.rejects(pathInside(sandbox, '../escape'), /does not name a directory inside the sandbox/);
  await t.rejects(pathInside(sandbox, '.'), /does not name a directory inside the sandbox/);
  await t.rejects(pathInside(sandbox, 'taken'), /already exists/);
});

t.test('a build step that runs past its time limit is killed with its children and fails saying so', async (t) => {
  const started = Date.now();
  const out: string[] = [];
  await t.rejects(
    runStreamed(
      'git clone',
      'bash',
      ['-c', 'echo fetching; sleep 30 & wait'],
      { cwd: tmpdir(), env: { PATH: process.env.PATH ?? '' }, timeoutMs: 300 },
      (_stream, data) => out.push(data),
    ),
    { message: 'git clone timed out after 0.3 s' },
  );
  t.ok(Date.now() - started < 5000, 'it did not wait for the sleeping child');
  t.same(out, ['fetching\n'], 'output before the limit was streamed');
});
