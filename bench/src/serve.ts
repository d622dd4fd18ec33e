/**
 * A bench target: the service on embedded storage, rate limit off, logging silent, either
 * behind the edge (`edge`) or Fastify alone (`direct`). Prints `READY <url>` when listening.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig, startService } from '@svc/gateway';

const mode = process.argv[2] === 'direct' ? 'direct' : 'edge';
const config = loadConfig({
  PORT: '0',
  DATABASE_URL: 'memory',
  DATA_DIR: mkdtempSync(join(tmpdir(), 'svc-bench-')),
  MASTER_KEY: randomBytes(32).toString('hex'),
  RATE_LIMIT_PER_MINUTE: '0',
  LOG_LEVEL: 'silent',
  EDGE: mode === 'edge' ? 'true' : 'false',
});
const service = await startService(config);
process.stdout.write(`READY ${service.url}\n`);
process.on('SIGTERM', () => {
  void service.close().then(() => process.exit(0));
});
