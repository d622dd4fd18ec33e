/**
 * The egress log of a runner that lost the service for a while: a brokered request made while
 * the runner is disconnected is listed once it is connected again (the runner holds the rows).
 */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpsServer } from 'node:https';
import { type AddressInfo, connect, createServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SandboxCa } from 'svc-runner';
import t from 'tap';
import { startFakeProvider } from './fakes/inference-provider.ts';
import { primaryBackend, signUp, startTestService } from './harness.ts';
import { claudeAgent, SCRIPTED_AGENT_COMMAND, startRunnerProcess } from './runner-process.ts';
import { run64, turnSettled } from './scripted-turns.ts';
import type { WireEvent } from './sse-client.ts';
import { until } from './until.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('a brokered call made while the runner is disconnected is in the egress log once it is back', async (t) => {
  const serverCa = await SandboxCa.create('test-server');
  const leaf = await serverCa.leaf('127.0.0.2');
  const caFile = join(mkdtempSync(join(tmpdir(), 'svc-egress-offline-ca-')), 'ca.pem');
  writeFileSync(caFile, serverCa.certPem);
  let calls = 0;
  const api = createHttpsServer({ key: leaf.key, cert: leaf.cert }, (_req, res) => {
    calls++;
    res.end('api answered');
  });
  await new Promise<void>((resolve) => api.listen(0, '127.0.0.2', resolve));
  const apiPort = (api.address() as AddressInfo).port;
  t.teardown(() => api.close());
  const model = await startFakeProvider();
  t.teardown(() => model.close());
  const svc = await startTestService(t, {
    backend: primaryBackend(),
    // The runner is away for a few seconds: its turn is not ended as adrift meanwhile.
    env: { RUNTIME_CLAUDE_COMMAND: SCRIPTED_AGENT_COMMAND, ANTHROPIC_BASE_URL: model.url, RUNNER_GRACE_MS: '60000' },
  });
  const { http } = svc;
  const { key: token } = await signUp(svc);
  const { agent } = await claudeAgent(t, http, token, 'runner', {
    networking_config: { allowed_hosts: [`127.0.0.2:${apiPort}`] },
  });
  const vault = (await http.post('/api/vaults', { token, body: { name: 'prod' } })).body;
  await http.post(`/api/vaults/${vault.id}/secrets`, { token, body: { key: 'API_TOKEN', value: 'real-0123456789' } });
  const binding = await http.post('/api/secret-bindings', {
    token,
    body: { secret_name: 'API_TOKEN', host: `127.0.0.2:${apiPort}`, shape: 'bearer' },
  });
  t.equal(binding.status, 201, binding.text);

  // The runner reaches the service through a relay this test can cut.
  let open = true;
  const links = new Set<Socket>();
  const relay = createServer((client) => {
    if (!open) return client.destroy();
    const upstream = connect(Number(new URL(svc.url).port), '127.0.0.1');
    links.add(client);
    client.on('close', () => links.delete(client));
    client.pipe(upstream).pipe(client);
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise<void>((resolve) => relay.listen(0, '127.0.0.1', resolve));
  t.teardown(() => relay.close());
  const runnerRow = (await http.post('/api/runners', { token, body: { name: 'box' } })).body;
  const before = process.env.NODE_EXTRA_CA_CERTS;
  process.env.NODE_EXTRA_CA_CERTS = caFile;
  const runner = await startRunnerProcess(
    t,
    `http://127.0.0.1:${(relay.address() as AddressInfo).port}`,
    runnerRow.token,
  );
  if (before === undefined) delete process.env.NODE_EXTRA_CA_CERTS;
  else process.env.NODE_EXTRA_CA_CERTS = before;

  // The call waits for a gate the test opens once the runner is cut off (in the checkout: the
  // machine's /tmp is not the sandbox's).
  const gates = fileURLToPath(new URL('../../.tap/', import.meta.url));
  mkdirSync(gates, { recursive: true });
  const gateDir = mkdtempSync(join(gates, 'egress-offline-'));
  t.teardown(() => rmSync(gateDir, { recursive: true, force: true }));
  chmodSync(gateDir, 0o755);
  const gate = join(gateDir, 'go');
  const line = `while [ ! -e ${gate} ]; do sleep 0.05; done; curl -sS https://127.0.0.2:${apiPort}/v1/me -H "authorization: Bearer $API_TOKEN"`;
  const res = await http.post('/api/conversations', {
    token,
    body: { agent_id: agent.id, vault_id: vault.id, prompt: run64([line]) },
  });
  t.equal(res.status, 201, JSON.stringify(res.body));
  const id = res.body.id as string;
  await until('the turn to start on the runner', () => /turn \S+ of conversation \S+ started/.test(runner.output));

  open = false;
  for (const link of links) link.destroy();
  await until('the runner to notice', () => /connection lost/.test(runner.output));
  writeFileSync(gate, '');
  await until('the call to reach the bound host', () => calls === 1);
  // The turn ends on the runner while it is still cut off (the proxy's row is made by then).
  await until('the turn to end on the runner', () => /turn \S+ of conversation \S+ ended: done/.test(runner.output));
  await sleep(100);
  const reopenedAt = Date.now();
  open = true;

  t.equal(await turnSettled(http, token, id), 'done', runner.output);
  const ended = (
    (await http.get(`/api/conversations/${id}/events?limit=1000`, { token })).body.data as WireEvent[]
  ).find((e) => e.kind === 'stage' && e.stage === 'turn' && e.state === 'done');
  t.ok(
    ended && Date.parse(ended.ts) < reopenedAt,
    `the turn's end, sent after the reconnect, carries the time it happened (${ended?.ts}), not its arrival's`,
  );
  let rows: Record<string, unknown>[] = [];
  await until('the egress row', async () => {
    rows = (await http.get(`/api/conversations/${id}/egress`, { token })).body.data;
    return rows.some((r) => r.host === '127.0.0.2');
  }).catch(() => {});
  t.match(
    rows.find((r) => r.host === '127.0.0.2'),
    { port: apiPort, binding_id: binding.body.id, status: 200, refused: false },
    `the call made while disconnected is listed: ${JSON.stringify(rows)}\n${runner.output}`,
  );
});
