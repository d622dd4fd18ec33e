/**
 * The four real runtimes (Claude Code through claude-agent-acp, Codex through codex-acp,
 * Gemini CLI, opencode) through the egress credential broker, each against a fake of its
 * model provider served over HTTPS the way a real provider is: under a host name (not a
 * loopback address the sandbox's own bridges would carry), with a certificate of a test CA
 * that only the runner trusts. Isolated (the default), a runtime's one way to that host is
 * the runner's proxy, which terminates its TLS with the sandbox's own CA and writes the real
 * credential in; so each runtime's own HTTPS client must honour the proxy variables and trust
 * the sandbox's CA. One service and one runner carry the four conversations, run at once.
 */

import { lookup } from 'node:dns/promises';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SandboxCa } from 'svc-runner';
import t from 'tap';
import { CLAUDE_CODE_OFFLINE, startFakeAnthropic, textOf } from './fakes/anthropic-messages.ts';
import { contentText, startFakeGemini } from './fakes/gemini-generate.ts';
import { inputText, startFakeOpenAI } from './fakes/openai-responses.ts';
import { servedOverTls } from './fakes/tls-front.ts';
import { signUp } from './harness.ts';
import { checkPlainTurn, launchAndWatch, serviceForRuntime, startRunnerAgent } from './real-runtime.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const CLAUDE_ACP = fileURLToPath(import.meta.resolve('@zed-industries/claude-agent-acp/dist/index.js'));
const CODEX_ACP = fileURLToPath(import.meta.resolve('@zed-industries/codex-acp/bin/codex-acp.js'));
const GEMINI = fileURLToPath(import.meta.resolve('@google/gemini-cli/bundle/gemini.js'));
const OPENCODE = join(
  dirname(fileURLToPath(import.meta.resolve('opencode-linux-x64/package.json'))),
  'bin',
  'opencode',
);

const KEYS = {
  anthropic: 'sk-ant-api03-brokered-https-fake-key',
  openai: 'sk-proj-brokered-https-fake-openai-key',
  gemini: 'AIza-brokered-https-fake-gemini-key',
};
const REPLY = 'I am the release captain of project Quokka.';
const THINKING = 'Introduce myself.';

/** What keeps opencode off the internet: no models.dev catalogue fetch, no self-update, no plugin or LSP downloads. */
const OPENCODE_OFFLINE = {
  OPENCODE_DISABLE_MODELS_FETCH: '1',
  OPENCODE_DISABLE_AUTOUPDATE: '1',
  OPENCODE_DISABLE_DEFAULT_PLUGINS: '1',
  OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
};

/**
 * The environments of the processes marked `MARK=<value>` (the sandbox's, found from outside
 * through /proc), sampled every 100 ms until `stop()`: the runtime's own environment is read
 * while it runs.
 */
function watchEnvirons(value: string) {
  const seen = new Map<string, string>();
  let on = true;
  const sample = () => {
    for (const pid of readdirSync('/proc')) {
      if (!/^\d+$/.test(pid)) continue;
      try {
        const environ = readFileSync(`/proc/${pid}/environ`, 'latin1');
        if (environ.split('\0').includes(`BROKER_RUNTIME=${value}`)) seen.set(pid, environ);
      } catch {}
    }
  };
  const loop = (async () => {
    while (on) {
      sample();
      await sleep(100);
    }
  })();
  return async () => {
    on = false;
    await loop;
    sample();
    return [...seen.values()];
  };
}

t.test("each runtime's own HTTPS client reaches its provider through the broker", async (t) => {
  // A host name for the fakes: this machine's own, which the runner resolves (to wherever it
  // points) and the sandbox, with no network of its own, can only reach through the proxy.
  const host = hostname();
  const address = (await lookup(host).catch(() => undefined))?.address;
  // `localhost` would be the sandbox's own (NO_PROXY), not a way through the proxy.
  if (!address || host === 'localhost') {
    t.plan(0, `this machine's host name (${host}) does not resolve, or is localhost`);
    return;
  }
  const testCa = await SandboxCa.create('test-providers');
  const leaf = await testCa.leaf(host);
  const caDir = mkdtempSync(join(tmpdir(), 'svc-provider-ca-'));
  t.teardown(() => rmSync(caDir, { recursive: true, force: true }));
  // What the runner trusts: what this machine's Node processes already do, and the test CA.
  const caFile = join(caDir, 'ca.pem');
  const machine = process.env.NODE_EXTRA_CA_CERTS;
  writeFileSync(caFile, `${machine ? readFileSync(machine, 'utf8').trimEnd() : ''}\n${testCa.certPem}`);

  const anthropic = await startFakeAnthropic({
    apiKey: KEYS.anthropic,
    models: ['claude-sonnet-4-5'],
    reply: () => ({
      content: [
        { type: 'thinking', thinking: THINKING },
        { type: 'text', text: REPLY },
      ],
    }),
  });
  // Codex and opencode share the OpenAI fake; each call is told apart by its prompt.
  const openai = await startFakeOpenAI({
    apiKey: KEYS.openai,
    models: ['gpt-5.4'],
    reply: () => ({
      output: [
        { type: 'reasoning', summary: THINKING },
        { type: 'text', text: REPLY },
      ],
    }),
  });
  const gemini = await startFakeGemini({
    apiKey: KEYS.gemini,
    models: ['gemini-2.5-pro'],
    reply: () => ({ parts: [{ thought: THINKING }, { text: REPLY }] }),
  });
  const tls = { host, address, key: leaf.key, cert: leaf.cert };
  const fronts = {
    anthropic: await servedOverTls(anthropic, tls),
    openai: await servedOverTls(openai, tls),
    gemini: await servedOverTls(gemini, tls),
  };
  const closeFakes = async () => {
    await Promise.all(Object.values(fronts).map((f) => f.close()));
    await Promise.all([anthropic.close(), openai.close(), gemini.close()]);
  };

  const svc = await serviceForRuntime(t, {
    RUNTIME_CLAUDE_COMMAND: `${process.execPath} ${CLAUDE_ACP}`,
    RUNTIME_CODEX_COMMAND: `${process.execPath} ${CODEX_ACP}`,
    RUNTIME_GEMINI_COMMAND: `${process.execPath} ${GEMINI} --experimental-acp`,
    RUNTIME_OPENCODE_COMMAND: `${OPENCODE} acp`,
    ANTHROPIC_BASE_URL: fronts.anthropic.url,
    OPENAI_BASE_URL: fronts.openai.url,
    GEMINI_BASE_URL: fronts.gemini.url,
  });
  const { http } = svc;
  const { key: token } = await signUp(svc);
  t.equal((await http.get('/api/auth/me', { token })).body.brokered, true, 'the account is brokered');
  // Stored unchecked: the check runs in this process, which does not trust the test CA.
  for (const [credential, value] of [
    ['anthropic_api_key', KEYS.anthropic],
    ['openai_api_key', KEYS.openai],
    ['gemini_api_key', KEYS.gemini],
  ]) {
    const put = await http.put(`/api/account/inference-credentials/${credential}`, {
      token,
      body: { value, validate: false },
    });
    t.equal(put.status, 200, JSON.stringify(put.body));
  }

  // Only the runner trusts the providers' CA (NODE_EXTRA_CA_CERTS is read when it starts), as
  // a runner trusts the public CAs of real providers; the sandbox never sees it, only its broker's.
  const before = process.env.NODE_EXTRA_CA_CERTS;
  process.env.NODE_EXTRA_CA_CERTS = caFile;
  const runner = await startRunnerAgent(t, svc, token, closeFakes).finally(() => {
    if (before === undefined) delete process.env.NODE_EXTRA_CA_CERTS;
    else process.env.NODE_EXTRA_CA_CERTS = before;
  });

  /**
   * Each runtime: its agent's model, its environment's variables, the variable its credential
   * is in, the provider's TLS front, and what that provider received (the last user text of
   * each call and the credential it carried) with the credential it should have carried.
   */
  const runtimes = {
    claude: {
      model: 'anthropic/claude-sonnet-4-5',
      env: CLAUDE_CODE_OFFLINE,
      variable: 'ANTHROPIC_API_KEY',
      key: KEYS.anthropic,
      front: fronts.anthropic,
      sent: KEYS.anthropic,
      received: () =>
        anthropic
          .messages()
          .map((c) => ({ said: textOf(c.body?.messages?.at(-1)?.content), credential: c.headers['x-api-key'] })),
    },
    codex: {
      model: 'openai/gpt-5.4',
      env: {},
      variable: 'OPENAI_API_KEY',
      key: KEYS.openai,
      front: fronts.openai,
      sent: `Bearer ${KEYS.openai}`,
      received: () =>
        openai.responses().map((c) => ({ said: inputText(c.body, 'user'), credential: c.headers.authorization })),
    },
    gemini: {
      model: 'google/gemini-2.5-pro',
      env: {},
      variable: 'GEMINI_API_KEY',
      key: KEYS.gemini,
      front: fronts.gemini,
      sent: KEYS.gemini,
      received: () =>
        gemini.streams().map((c) => ({ said: contentText(c.body, 'user'), credential: c.headers['x-goog-api-key'] })),
    },
    opencode: {
      model: 'openai/gpt-5.4',
      env: OPENCODE_OFFLINE,
      variable: 'OPENAI_API_KEY',
      key: KEYS.openai,
      front: fronts.openai,
      sent: `Bearer ${KEYS.openai}`,
      received: () =>
        openai.responses().map((c) => ({ said: inputText(c.body, 'user'), credential: c.headers.authorization })),
    },
  };
  const promptOf = (runtime: string) => `Who are you, ${runtime}? Answer in one line.`;

  // The four conversations at once; each is checked below in a test of its own.
  const started = Date.now();
  const runs = Object.fromEntries(
    await Promise.all(
      Object.entries(runtimes).map(async ([runtime, r]) => {
        const env = (
          await http.post('/api/environments', {
            token,
            body: { name: `brokered ${runtime}`, env_vars: { ...r.env, BROKER_RUNTIME: runtime } },
          })
        ).body;
        const agent = (
          await http.post('/api/agents', {
            token,
            body: {
              name: `${runtime} coder`,
              runtime,
              model: r.model,
              system: 'You answer as the release captain of project Quokka.',
              environment_id: env.id,
              sandbox_provider: 'runner',
            },
          })
        ).body;
        const stop = watchEnvirons(runtime);
        const run = await launchAndWatch(svc, token, agent.id, promptOf(runtime)).finally(() => stop());
        return [runtime, { run, environs: await stop(), ms: Date.now() - started }] as const;
      }),
    ),
  );

  for (const [runtime, r] of Object.entries(runtimes)) {
    await t.test(`${runtime}: the turn runs through the broker, the sandbox holding only a placeholder`, async (t) => {
      const { run, environs, ms } = runs[runtime] as (typeof runs)[string];
      const log = () => `runner said: ${runner.output()}`;
      await checkPlainTurn(t, svc, token, run, { reply: REPLY, thinking: THINKING, log });
      t.comment(`${runtime}: launch to turn end ${ms} ms`);

      // What the provider received: this conversation's calls, with the real credential.
      const prompt = promptOf(runtime);
      const calls = r.received().filter((c) => c.said.includes(prompt));
      t.ok(calls.length >= 1, `the provider answered the turn, the prompt in it (${calls.length} calls)`);
      const all = r.received();
      t.ok(
        all.every((c) => c.credential === r.sent),
        `every call with the real credential in its header: ${JSON.stringify(all.map((c) => c.credential))}`,
      );

      // What the sandbox held: the placeholder, never the key.
      t.ok(environs.length >= 1, 'the sandbox’s processes were found');
      const placeholder = new RegExp(`(^|\\0)${r.variable}=svc-placeholder-[A-Za-z0-9_-]+(\\0|$)`);
      t.ok(
        environs.some((e) => placeholder.test(e)),
        `the runtime’s ${r.variable} is a placeholder`,
      );
      t.notOk(
        environs.some((e) => e.includes(r.key)),
        'no process of the sandbox holds the key',
      );
      t.notOk(JSON.stringify(run.events).includes(r.key), 'nor does the event log');

      // The egress log: the calls, to the provider's host, brokered, answered. A row with the
      // request's method is one the broker read in the clear, its TLS terminated; a tunnel it
      // could not read would be a CONNECT row.
      const port = Number(new URL(r.front.url).port);
      let rows: Record<string, unknown>[] = [];
      for (let i = 0; i < 100; i++) {
        rows = (await http.get(`/api/conversations/${run.id}/egress`, { token })).body.data;
        if (rows.some((row) => row.host === host && row.port === port)) break;
        await sleep(50);
      }
      t.match(
        rows.find((row) => row.host === host && row.port === port && row.method === 'POST'),
        { binding_id: null, status: 200, refused: false, reason: null, latency_ms: Number },
        `the egress log lists the call to ${host}:${port}: ${JSON.stringify(rows)}`,
      );
      t.notOk(
        rows.some((row) => row.host === host && row.method === 'CONNECT'),
        'none of it tunnelled unread',
      );
      // Other hosts a runtime tries on its own (Claude Code's plugin blocklist, Gemini CLI's
      // usage reports) are refused here, having no name this machine resolves; its provider's never.
      const elsewhere = rows
        .filter((row) => row.host !== host)
        .map((row) => `${row.method} ${row.host}: ${row.reason ?? row.status}`);
      if (elsewhere.length) t.comment(`${runtime} also tried: ${[...new Set(elsewhere)].join('; ')}`);
      t.notOk(
        rows.some((row) => row.host === host && row.refused),
        'no call to the provider was refused',
      );
    });
  }
});
