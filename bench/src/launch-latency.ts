/**
 * How long a conversation takes from `POST /api/conversations` to its first event, to the
 * runtime's first update, and to the end of the turn, on the `local` sandbox provider (a
 * runner-agent child per sandbox) with the scripted ACP agent of the tests as the runtime.
 * The service runs in this process on embedded defaults; each launch is watched over SSE.
 *
 *   npm run bench:launch -- [--runs 20]
 *
 * Writes bench/reports/launch-latency-<time>.{json,md}.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { loadConfig } from '../../gateway/src/config.ts';
import { createLogger, startService } from '../../gateway/src/main.ts';
import { signUp } from './tenant.ts';

const { values } = parseArgs({ options: { runs: { type: 'string', default: '20' } } });
const runs = Number(values.runs);
const agentScript = fileURLToPath(new URL('../../test/src/fixtures/scripted-acp-agent.ts', import.meta.url));
const tsx = import.meta.resolve('tsx');

const config = loadConfig({
  PORT: '0',
  DATABASE_URL: 'memory',
  DATA_DIR: mkdtempSync(join(tmpdir(), 'svc-bench-launch-')),
  RATE_LIMIT_PER_MINUTE: '0',
  LOG_LEVEL: 'warn',
  RUNTIME_CLAUDE_COMMAND: `${process.execPath} --import ${tsx} ${agentScript}`,
  // Every launch keeps its sandbox (nothing ends them yet): room for all of them in one account.
  SANDBOX_QUOTA_DEFAULT: String(Math.max(runs, 10)),
  FLEET_MAX_SANDBOXES: String(Math.max(runs, 100)),
});
const svc = await startService(config, createLogger('warn'));
const me = await signUp(svc);
const api = async (method: string, path: string, body?: unknown) => {
  const res = await fetch(`${svc.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${me.key}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return (await res.json()) as Record<string, unknown>;
};
await api('PUT', '/api/account/inference-credentials/anthropic_api_key', { value: 'sk-ant-bench-credential-0000' });
const env = await api('POST', '/api/environments', { name: 'bench' });
const agent = await api('POST', '/api/agents', {
  name: 'bench',
  runtime: 'claude',
  model: 'anthropic/claude-sonnet-4-5',
  environment_id: env.id,
});

/** Watches a conversation's stream; resolves with when the first event, the first acp event and the end came. */
function watch(id: string, t0: number): Promise<{ first: number; acp: number; end: number }> {
  return new Promise((resolve) => {
    const url = new URL(svc.url);
    const sock = connect(Number(url.port), url.hostname);
    let text = '';
    let first = 0;
    let acp = 0;
    sock.on('data', (d: Buffer) => {
      const now = performance.now();
      text += d.toString('latin1');
      if (!first && text.includes('\nid: ')) first = now - t0;
      if (!acp && text.includes('"stream":"acp"')) acp = now - t0;
    });
    sock.on('close', () => resolve({ first, acp, end: performance.now() - t0 }));
    sock.write(
      `GET /api/conversations/${id}/stream?last_event_id=0 HTTP/1.1\r\nhost: ${url.host}\r\nauthorization: Bearer ${me.key}\r\nconnection: close\r\n\r\n`,
    );
  });
}

const rows: { first: number; acp: number; end: number }[] = [];
for (let i = 0; i < runs; i++) {
  const t0 = performance.now();
  const conv = await api('POST', '/api/conversations', { agent_id: agent.id, prompt: `hello ${i}` });
  if (typeof conv.id !== 'string') throw new Error(`launch failed: ${JSON.stringify(conv)}`);
  rows.push(await watch(conv.id, t0));
  process.stdout.write(`\r  launch ${i + 1}/${runs}`);
}
process.stdout.write('\n');
await svc.close();

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return Number(
    (s.length % 2 ? s[(s.length - 1) / 2] : ((s[s.length / 2 - 1] ?? 0) + (s[s.length / 2] ?? 0)) / 2)?.toFixed(0),
  );
};
const figures = {
  runs,
  provider: 'local',
  medianFirstEventMs: median(rows.map((r) => r.first)),
  medianFirstAcpEventMs: median(rows.map((r) => r.acp)),
  medianTurnEndMs: median(rows.map((r) => r.end)),
  all: rows.map((r) => ({ first: Math.round(r.first), acp: Math.round(r.acp), end: Math.round(r.end) })),
  machine: { cores: cpus().length, node: process.version },
  command: `npm run bench:launch -- ${process.argv.slice(2).join(' ')}`.trim(),
};
process.stdout.write(`${JSON.stringify({ ...figures, all: undefined }, null, 2)}\n`);
const dir = join(fileURLToPath(new URL('.', import.meta.url)), '..', 'reports');
mkdirSync(dir, { recursive: true });
const stamp = new Date().toISOString().replace(/[:.]/g, '-');
writeFileSync(join(dir, `launch-latency-${stamp}.json`), `${JSON.stringify(figures, null, 2)}\n`);
writeFileSync(
  join(dir, `launch-latency-${stamp}.md`),
  [
    `# Launch latency, local provider (${runs} launches)`,
    '',
    `\`${figures.command}\` on ${figures.machine.cores} cores, Node ${figures.machine.node}.`,
    '',
    '| from POST /api/conversations to | median ms |',
    '|---|---|',
    `| the first event (stage \`sandbox\` started) | ${figures.medianFirstEventMs} |`,
    `| the runtime's first update (\`acp\`) | ${figures.medianFirstAcpEventMs} |`,
    `| the end of the turn (stream closed) | ${figures.medianTurnEndMs} |`,
    '',
    'Each launch starts a runner-agent process and the scripted ACP agent (both Node with tsx),',
    'so most of the time to the first update is process start-up.',
    '',
  ].join('\n'),
);
