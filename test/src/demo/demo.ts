/**
 * `npm run demo` (test/demo.mjs): an agent answering without a model key. The service on its
 * embedded defaults (data under DEMO_DATA_DIR, `.data/demo` unless set, so `npm start`'s
 * `.data` is left alone), a local stand-in for the Anthropic Messages API, and the real Claude
 * Code agent through claude-agent-acp, started by a local runner-agent as for any sandbox. It
 * walks through the API calls a user would make, prints them, and keeps the service running
 * with the conversation until SIGINT or SIGTERM, which stop everything and exit 0.
 */
import { createServer } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Config, ConfigError, loadConfig } from '../../../gateway/src/config.ts';
import { createLogger, type Service, startService } from '../../../gateway/src/main.ts';
import { startStandInModel } from './stand-in.ts';
import { Lines, StepFailed, walkthrough } from './walkthrough.ts';

const CLAUDE_ACP = fileURLToPath(import.meta.resolve('@zed-industries/claude-agent-acp/dist/index.js'));

const out = new Lines((text) => process.stdout.write(text));

/** Whether something already listens on host:port (checked before anything starts). */
function portTaken(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'EADDRINUSE'));
    probe.listen(port, host, () => probe.close(() => resolve(false)));
  });
}

/** Prints why the demo cannot go on and exits with `code`. */
function refuse(message: string, code: number): never {
  process.stderr.write(`${message}\n`);
  process.exit(code);
}

export async function runDemo(env: NodeJS.ProcessEnv): Promise<void> {
  const dataDir = env.DEMO_DATA_DIR ?? join('.data', 'demo');
  // Only what the demo chooses: a DATABASE_URL or REDIS_URL exported for `npm start` is ignored.
  let chosen: Config;
  try {
    chosen = loadConfig({
      PORT: env.PORT ?? '8080',
      HOST: env.HOST ?? '127.0.0.1',
      DATA_DIR: dataDir,
      LOG_LEVEL: env.LOG_LEVEL ?? 'warn',
      RUNTIME_CLAUDE_COMMAND: `${process.execPath} ${CLAUDE_ACP}`,
    });
  } catch (err) {
    if (err instanceof ConfigError) refuse(err.message, 78);
    throw err;
  }
  const { HOST: host, PORT: port } = chosen;
  if (port !== 0 && (await portTaken(host, port))) {
    refuse(
      `Port ${port} on ${host} is taken (is \`npm start\` or another demo running?).\n` +
        'Stop it, or run the demo on another port: PORT=8081 npm run demo',
      1,
    );
  }

  const standIn = await startStandInModel((line) => out.line(`  (stand-in model API: ${line})`));
  const config: Config = { ...chosen, ANTHROPIC_BASE_URL: standIn.url };
  let service: Service | undefined;
  let stopping = false;
  // As `npm start` does: requests under way get SHUTDOWN_GRACE_MS, and a shutdown that hangs
  // past it (and a few seconds for the runner-agent and its runtimes) exits 1.
  const stop = async (code: number) => {
    if (stopping) return;
    stopping = true;
    out.line('\nStopping the service, its runner-agent and the stand-in.');
    setTimeout(() => process.exit(1), config.SHUTDOWN_GRACE_MS + 5000).unref();
    await service?.close().catch((err: Error) => process.stderr.write(`shutdown: ${err.message}\n`));
    await standIn.close();
    process.exit(code);
  };
  process.on('SIGINT', () => void stop(0));
  process.on('SIGTERM', () => void stop(0));

  try {
    service = await startService(config, createLogger(config.LOG_LEVEL));
  } catch (err) {
    process.stderr.write(`The service could not start: ${(err as Error).message}\n`);
    return stop(1);
  }
  const base = service.url;
  out.line(
    [
      `svc demo: the service on ${base} (embedded defaults, data in ${dataDir}),`,
      `a stand-in for the Anthropic Messages API on ${standIn.url},`,
      'and the real Claude Code agent, run by a local runner-agent.',
    ].join('\n'),
  );
  try {
    const { key, conversationId, turn } = await walkthrough({
      base,
      mailDir: join(dataDir, 'mail'),
      out,
    });
    const auth = `-H 'authorization: Bearer ${key}'`;
    out.line(
      [
        '',
        turn.state === 'done' ? 'The agent answered.' : `The turn ended ${turn.state}.`,
        'The service keeps running until Ctrl-C. Look at the conversation over SSE:',
        `  curl -N '${base}/api/conversations/${conversationId}/stream?blocks=true' ${auth}`,
        'Give it another prompt:',
        `  curl -X POST ${base}/api/conversations/${conversationId}/prompts ${auth} \\`,
        `    -H 'content-type: application/json' -d '{"prompt":"And now?"}'`,
        `API reference: ${base}/api/docs`,
      ].join('\n'),
    );
  } catch (err) {
    const why = err instanceof StepFailed ? err.message : ((err as Error).stack ?? String(err));
    process.stderr.write(`\nThe demo stopped: ${why}\n`);
    await stop(1);
  }
}
