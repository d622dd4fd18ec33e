import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cpus, release, totalmem } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));

function tryRun(cmd: string, args: string[]): string | undefined {
  try {
    return execFileSync(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], timeout: 5000 })
      .toString()
      .trim()
      .split('\n')[0];
  } catch (err) {
    // nginx -v prints to stderr
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
    return stderr || undefined;
  }
}

function packageVersion(name: string): string | undefined {
  try {
    const pkg = JSON.parse(readFileSync(join(repoRoot, 'node_modules', name, 'package.json'), 'utf8')) as {
      version: string;
    };
    return pkg.version;
  } catch {
    return undefined;
  }
}

/** The machine and the versions of what a run measured, for every result file. */
export function describeMachine(): Record<string, unknown> {
  const cpu = cpus();
  return {
    cores: cpu.length,
    cpuModel: cpu[0]?.model,
    memoryBytes: totalmem(),
    kernel: release(),
    node: process.version,
    openFilesLimit: Number(tryRun('sh', ['-c', 'ulimit -n'])),
    versions: {
      'uWebSockets.js': packageVersion('uWebSockets.js'),
      ws: packageVersion('ws'),
      fastify: packageVersion('fastify'),
      ioredis: packageVersion('ioredis'),
      autocannon: packageVersion('autocannon'),
      redis: tryRun('redis-server', ['--version']),
      nginx: tryRun('nginx', ['-v']),
    },
  };
}
