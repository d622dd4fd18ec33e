/**
 * Delivery latency on the multiplexed stream: N watchers of one tenant's `/api/events/stream`
 * on one node while events are appended at a fixed rate through the write path. Each event
 * carries its append time; each watcher notes when its copy arrived. Reports append-to-receipt
 * p50/p99/p999 and deliveries per second. The service runs in this process on embedded
 * defaults (or on --redis); the watchers run in a child process, so reading does not steal
 * the server's turns (both processes read the same wall clock). Traffic stays on 127.0.0.1.
 *
 *   npm run bench:sse -- [--watchers 1000] [--rate 200] [--seconds 5] [--redis redis://127.0.0.1:6399]
 *
 * Writes bench/reports/sse-latency-<time>.{json,md}.
 */
import { fork } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const now = () => performance.timeOrigin + performance.now();

interface WatchJob {
  port: number;
  key: string;
  watchers: number;
  expected: number;
}

/** Worker: opens the watchers, records each event's latency, reports when all have arrived. */
async function watch(job: WatchJob): Promise<void> {
  const latencies: number[] = [];
  let connected = 0;
  let received = 0;
  const sockets = Array.from({ length: job.watchers }, () => {
    const sock = connect(job.port, '127.0.0.1');
    let carry = '';
    let open = false;
    sock.setNoDelay(true);
    sock.on('error', () => {});
    sock.on('data', (d: Buffer) => {
      const at = now();
      const text = carry + d.toString('latin1');
      if (!open && text.includes(': connected')) {
        open = true;
        connected++;
        if (connected === job.watchers) process.send?.({ type: 'ready' });
      }
      const re = /"data":"t:(\d+\.\d+)"/g;
      let last = 0;
      for (let m = re.exec(text); m; m = re.exec(text)) {
        latencies.push(at - Number(m[1]));
        received++;
        last = re.lastIndex;
      }
      carry = text.slice(Math.max(last, text.length - 64));
    });
    sock.write(
      `GET /api/events/stream HTTP/1.1\r\nhost: 127.0.0.1:${job.port}\r\nauthorization: Bearer ${job.key}\r\n\r\n`,
    );
    return sock;
  });
  const deadline = Date.now() + 60_000;
  await new Promise<void>((resolve) => {
    process.on('message', (m: { type: string }) => {
      if (m.type !== 'done') return;
      const check = () => {
        if (received >= job.expected * job.watchers || Date.now() > deadline) resolve();
        else setTimeout(check, 50);
      };
      check();
    });
    const progress = setInterval(() => process.send?.({ type: 'progress', received }), 1000);
    progress.unref();
  });
  for (const s of sockets) s.destroy();
  // A summary, not a million numbers over IPC.
  const sorted = latencies.sort((a, b) => a - b);
  const summary = Object.fromEntries([50, 90, 99, 99.9, 100].map((p) => [String(p), percentile(sorted, p)]));
  process.send?.({ type: 'result', summary, received });
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      watchers: { type: 'string', default: '1000' },
      rate: { type: 'string', default: '200' },
      seconds: { type: 'string', default: '5' },
      redis: { type: 'string' },
    },
  });
  const watchers = Number(values.watchers);
  const rate = Number(values.rate);
  const seconds = Number(values.seconds);
  const { startService, createLogger } = await import('../../gateway/src/main.ts');
  const { loadConfig } = await import('../../gateway/src/config.ts');
  const { signUp } = await import('./tenant.ts');
  const { createConversationRecord } = await import('../../gateway/src/services/conversations.ts');
  const config = loadConfig({
    PORT: '0',
    DATABASE_URL: 'memory',
    REDIS_URL: values.redis,
    REDIS_KEY_PREFIX: `bench${Date.now()}:`,
    RATE_LIMIT_PER_MINUTE: '0',
    LOG_LEVEL: 'warn',
    SSE_HEARTBEAT_MS: '15000',
    SSE_IDLE_CLOSE_MS: '0',
  });
  const svc = await startService(config, createLogger('warn'));
  const me = await signUp(svc);
  const conv = await createConversationRecord(
    svc.db.sql,
    { accountId: me.accountId, actor: 'api', ip: null },
    { agentId: 'agt_bench', title: 'bench' },
  );
  await new Promise((r) => setTimeout(r, 500)); // the creation's change event goes first
  const total = rate * seconds;
  const child = fork(
    fileURLToPath(import.meta.url),
    ['--watch-job', JSON.stringify({ port: svc.port, key: me.key, watchers, expected: total } satisfies WatchJob)],
    {
      execArgv: ['--import', 'tsx'],
    },
  );
  type Message = { type: string; summary?: Record<string, number>; received?: number };
  const messages: Message[] = [];
  const waiting = new Map<string, (m: Message) => void>();
  child.on('message', (m: Message) => {
    if (m.type === 'progress') {
      process.stdout.write(`\r  delivered ${m.received}/${total * watchers}   `);
      return;
    }
    const w = waiting.get(m.type);
    if (w) w(m);
    else messages.push(m);
  });
  const next = (type: string) =>
    new Promise<Message>((resolve) => {
      const found = messages.find((m) => m.type === type);
      if (found) resolve(found);
      else waiting.set(type, resolve);
    });
  await next('ready');
  process.stdout.write(`${watchers} watchers connected; appending ${rate}/s for ${seconds}s\n`);
  const cpuBefore = process.cpuUsage();
  const started = now();
  for (let i = 0; i < total; i++) {
    const due = started + (i * 1000) / rate;
    const wait = due - now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    await svc.appendEvents({
      tenant: me.accountId,
      producer: 'bench',
      seq: i + 1,
      events: [{ conversationId: conv.id, kind: 'output', stream: 'stdout', data: `t:${now().toFixed(3)}` }],
    });
    if (i % rate === 0) process.stdout.write(`\r  appended ${i + 1}/${total}`);
  }
  child.send({ type: 'done' });
  const result = await next('result');
  const elapsed = (now() - started) / 1000;
  const cpu = process.cpuUsage(cpuBefore);
  child.kill();
  await svc.close();
  const at = (p: string) => Number((result.summary?.[p] ?? Number.NaN).toFixed(2));
  const figures = {
    watchers,
    rate,
    seconds,
    store: values.redis ? 'redis' : 'memory',
    delivered: result.received ?? 0,
    expected: total * watchers,
    deliveriesPerSecond: Math.round((result.received ?? 0) / elapsed),
    p50ms: at('50'),
    p90ms: at('90'),
    p99ms: at('99'),
    p999ms: at('99.9'),
    maxMs: at('100'),
    serverCpuSeconds: Number(((cpu.user + cpu.system) / 1e6).toFixed(2)),
    machine: { cores: cpus().length, memoryGiB: Math.round(totalmem() / 2 ** 30), node: process.version },
    command: `npm run bench:sse -- ${process.argv.slice(2).join(' ')}`.trim(),
  };
  process.stdout.write(`\n${JSON.stringify(figures, null, 2)}\n`);
  const dir = join(fileURLToPath(new URL('.', import.meta.url)), '..', 'reports');
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  writeFileSync(join(dir, `sse-latency-${stamp}.json`), `${JSON.stringify(figures, null, 2)}\n`);
  writeFileSync(
    join(dir, `sse-latency-${stamp}.md`),
    [
      `# Delivery latency, /api/events/stream (${figures.store})`,
      '',
      `\`${figures.command}\` on ${figures.machine.cores} cores, Node ${figures.machine.node}.`,
      '',
      '| watchers | events/s appended | deliveries/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | delivered |',
      '|---|---|---|---|---|---|---|---|---|',
      `| ${watchers} | ${rate} | ${figures.deliveriesPerSecond} | ${figures.p50ms} | ${figures.p90ms} | ${figures.p99ms} | ${figures.p999ms} | ${figures.maxMs} | ${figures.delivered}/${figures.expected} |`,
      '',
      'Latency is append call to receipt by the watcher (append through the write path, live',
      'publish, edge fan-out, loopback socket). The server and the watchers share this machine.',
      '',
    ].join('\n'),
  );
}

const job = process.argv.indexOf('--watch-job');
if (job >= 0) {
  await watch(JSON.parse(process.argv[job + 1] as string) as WatchJob);
  process.exit(0);
} else {
  await main();
}
