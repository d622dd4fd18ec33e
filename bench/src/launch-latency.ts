/**
 * How long a conversation takes from `POST /api/conversations` to its first event, to the
 * runtime's first update, and to the end of the turn, on the `local` sandbox provider (a
 * runner-agent child per sandbox) with the scripted ACP agent of the tests as the runtime, and
 * what the sandbox's processes hold in memory once the turn is over (RSS and PSS of the
 * runner-agent's process tree: the runner-agent, the runtime, and with isolation bubblewrap
 * and the socat bridges). Each isolation mode (`--isolation`, default both) gets a service of
 * its own in this process, on embedded defaults; launches alternate between them, so the
 * machine's noise falls on both alike, and the report gives each mode's medians and the
 * ratio of `namespaces` to `none`. Each launch is watched over SSE.
 *
 *   npm run bench:launch -- [--runs 20] [--isolation namespaces,none]
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
import { createLogger, type Service, startService } from '../../gateway/src/main.ts';
import { pssOfTree, rssOfTree, treeOf } from './lib/proc.ts';
import { signUp } from './tenant.ts';

const { values } = parseArgs({
  options: { runs: { type: 'string', default: '20' }, isolation: { type: 'string', default: 'namespaces,none' } },
});
const runs = Number(values.runs);
const modes = (values.isolation ?? '').split(',').filter(Boolean) as ('namespaces' | 'none')[];
const agentScript = fileURLToPath(new URL('../../test/src/fixtures/scripted-acp-agent.ts', import.meta.url));
const tsx = import.meta.resolve('tsx');

interface Row {
  first: number;
  acp: number;
  end: number;
  rss: number;
  pss: number;
  processes: number;
}

/** One service on embedded defaults with sandboxes isolated as `mode`, an account and an agent on it. */
async function world(mode: 'namespaces' | 'none') {
  const config = loadConfig({
    PORT: '0',
    DATABASE_URL: 'memory',
    DATA_DIR: mkdtempSync(join(tmpdir(), 'svc-bench-launch-')),
    RATE_LIMIT_PER_MINUTE: '0',
    LOG_LEVEL: 'warn',
    SANDBOX_ISOLATION: mode,
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
  return { mode, svc, key: me.key, api, agentId: agent.id as string, rows: [] as Row[] };
}

/** Watches a conversation's stream; resolves with when the first event, the first acp event and the end came. */
function watch(
  svc: Service,
  key: string,
  id: string,
  t0: number,
): Promise<{ first: number; acp: number; end: number }> {
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
      `GET /api/conversations/${id}/stream?last_event_id=0 HTTP/1.1\r\nhost: ${url.host}\r\nauthorization: Bearer ${key}\r\nconnection: close\r\n\r\n`,
    );
  });
}

const worlds: Awaited<ReturnType<typeof world>>[] = [];
for (const mode of modes) worlds.push(await world(mode));
for (let i = 0; i < runs; i++) {
  for (const w of worlds) {
    const t0 = performance.now();
    const conv = await w.api('POST', '/api/conversations', { agent_id: w.agentId, prompt: `hello ${i}` });
    if (typeof conv.id !== 'string') throw new Error(`launch failed (${w.mode}): ${JSON.stringify(conv)}`);
    const times = await watch(w.svc, w.key, conv.id, t0);
    // The turn is over and its runtime waits for the next prompt: what the sandbox holds now.
    const sandbox = (await w.api('GET', `/api/conversations/${conv.id}`)).sandbox_id;
    const pid = w.svc.local.held().find((h) => h.sandboxId === sandbox)?.pid;
    const tree = pid ? { rss: rssOfTree(pid), pss: pssOfTree(pid), processes: treeOf(pid).length } : undefined;
    w.rows.push({ ...times, rss: tree?.rss ?? 0, pss: tree?.pss ?? 0, processes: tree?.processes ?? 0 });
    // One sandbox at a time: the next launch does not share the machine with this one.
    await w.api('POST', `/api/conversations/${conv.id}/terminate`);
  }
  process.stdout.write(`\r  launch ${i + 1}/${runs}`);
}
process.stdout.write('\n');
for (const w of worlds) await w.svc.close();

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return Number(
    (s.length % 2 ? s[(s.length - 1) / 2] : ((s[s.length / 2 - 1] ?? 0) + (s[s.length / 2] ?? 0)) / 2)?.toFixed(0),
  );
};
const mb = (bytes: number) => Number((bytes / 1024 / 1024).toFixed(1));
const byMode = Object.fromEntries(
  worlds.map((w) => [
    w.mode,
    {
      medianFirstEventMs: median(w.rows.map((r) => r.first)),
      medianFirstAcpEventMs: median(w.rows.map((r) => r.acp)),
      medianTurnEndMs: median(w.rows.map((r) => r.end)),
      medianTreeRssMb: mb(median(w.rows.map((r) => r.rss))),
      medianTreePssMb: mb(median(w.rows.map((r) => r.pss))),
      processes: median(w.rows.map((r) => r.processes)),
      all: w.rows.map((r) => ({
        first: Math.round(r.first),
        acp: Math.round(r.acp),
        end: Math.round(r.end),
        rssMb: mb(r.rss),
        pssMb: mb(r.pss),
      })),
    },
  ]),
) as Record<
  string,
  {
    medianFirstAcpEventMs: number;
    medianTurnEndMs: number;
    medianTreeRssMb: number;
    medianTreePssMb: number;
    medianFirstEventMs: number;
    processes: number;
  }
>;
const iso = byMode.namespaces;
const none = byMode.none;
const ratio = (a: number | undefined, b: number | undefined) => (a && b ? Number((a / b).toFixed(2)) : null);
const figures = {
  runs,
  provider: 'local',
  modes: byMode,
  namespacesOverNone:
    iso && none
      ? {
          firstAcpEvent: ratio(iso.medianFirstAcpEventMs, none.medianFirstAcpEventMs),
          turnEnd: ratio(iso.medianTurnEndMs, none.medianTurnEndMs),
          treePss: ratio(iso.medianTreePssMb, none.medianTreePssMb),
          addedStartMs: iso.medianFirstAcpEventMs - none.medianFirstAcpEventMs,
          addedPssMb: Number((iso.medianTreePssMb - none.medianTreePssMb).toFixed(1)),
        }
      : null,
  machine: { cores: cpus().length, node: process.version },
  command: `npm run bench:launch -- ${process.argv.slice(2).join(' ')}`.trim(),
};
process.stdout.write(
  `${JSON.stringify({ ...figures, modes: Object.fromEntries(Object.entries(byMode).map(([k, v]) => [k, { ...v, all: undefined }])) }, null, 2)}\n`,
);
const dir = join(fileURLToPath(new URL('.', import.meta.url)), '..', 'reports');
mkdirSync(dir, { recursive: true });
const stamp = new Date().toISOString().replace(/[:.]/g, '-');
writeFileSync(join(dir, `launch-latency-${stamp}.json`), `${JSON.stringify(figures, null, 2)}\n`);
const line = (label: string, pick: (m: (typeof byMode)[string]) => number) =>
  `| ${label} | ${worlds.map((w) => pick(byMode[w.mode] as (typeof byMode)[string])).join(' | ')} |`;
writeFileSync(
  join(dir, `launch-latency-${stamp}.md`),
  [
    `# Launch latency and footprint, local provider (${runs} launches per isolation mode)`,
    '',
    `\`${figures.command}\` on ${figures.machine.cores} cores, Node ${figures.machine.node}.`,
    '',
    `| median | ${worlds.map((w) => `isolation ${w.mode}`).join(' | ')} |`,
    `|---|${worlds.map(() => '---|').join('')}`,
    line('ms to the first event (stage `sandbox` started)', (m) => m.medianFirstEventMs),
    line("ms to the runtime's first update (`acp`)", (m) => m.medianFirstAcpEventMs),
    line('ms to the end of the turn (stream closed)', (m) => m.medianTurnEndMs),
    line("MB RSS of the sandbox's process tree after the turn", (m) => m.medianTreeRssMb),
    line('MB PSS of it', (m) => m.medianTreePssMb),
    line('processes in it', (m) => m.processes),
    '',
    figures.namespacesOverNone
      ? `namespaces / none: first update ${figures.namespacesOverNone.firstAcpEvent}x (${figures.namespacesOverNone.addedStartMs} ms more), turn end ${figures.namespacesOverNone.turnEnd}x, PSS ${figures.namespacesOverNone.treePss}x (${figures.namespacesOverNone.addedPssMb} MB more).`
      : '',
    '',
    'Each launch starts a runner-agent process and the scripted ACP agent (both Node with tsx),',
    'so most of the time to the first update is process start-up.',
    '',
  ].join('\n'),
);
