import { randomBytes } from 'node:crypto';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Logger } from 'pino';
import { type Config, ConfigError } from '../config.ts';
import { parseMasterKey } from './keyring.ts';

/**
 * MASTER_KEY wraps every tenant data key. When unset on an embedded start, one is generated
 * into DATA_DIR/master.key (mode 0600) and reused on later starts.
 */
export async function masterKey(config: Config, log: Logger): Promise<Buffer> {
  if (config.MASTER_KEY) return parseMasterKey(config.MASTER_KEY);
  if (config.DATABASE_URL && config.DATABASE_URL !== 'memory') {
    throw new ConfigError('invalid configuration:\n  MASTER_KEY: required when DATABASE_URL names a server');
  }
  if (config.DATABASE_URL === 'memory') return randomBytes(32);
  const file = join(config.DATA_DIR, 'master.key');
  try {
    return parseMasterKey(await readFile(file, 'utf8'));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  await mkdir(config.DATA_DIR, { recursive: true });
  const key = randomBytes(32);
  await writeFile(file, `${key.toString('hex')}\n`, { mode: 0o600, flag: 'wx' });
  log.info({ file: resolve(file) }, 'generated a master key; back it up with the data directory');
  return key;
}
