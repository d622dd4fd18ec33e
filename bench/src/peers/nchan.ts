import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensurePackages } from '../lib/apt.ts';
import { freePort, rssOfTree, startProcess } from '../lib/proc.ts';

export interface Nchan {
  port: number;
  /** The nginx master's pid; its workers are its children. */
  pid: number;
  /** Resident memory of the master and its workers. */
  rss(): number;
  /** The last lines nginx logged at `warn` or above (why connections were refused, say). */
  errors(): string[];
  stop(): Promise<void>;
}

const MODULE = '/usr/lib/nginx/modules/ngx_nchan_module.so';

/**
 * Nchan (Debian's nginx with libnginx-mod-nchan, installed through apt-get when absent) on a
 * free loopback port, configured in a temp dir: `GET /sub/<channel>` is an EventSource
 * subscriber of that channel, `POST /pub/<channel>` publishes the body to it. `workers` nginx
 * worker processes (1 for the per-process comparisons), each allowed `connections` sockets.
 */
export async function startNchan(
  opts: { workers?: number; connections: number },
  say: (s: string) => void = () => {},
): Promise<Nchan> {
  ensurePackages(['nginx', 'libnginx-mod-nchan'], say);
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'svc-bench-nchan-'));
  for (const d of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(dir, d));
  // nginx counts a connection per socket and more of its own (Nchan's subscribers need about
  // 5% more than there are); the hard cap on open files is 20,000 here.
  const files = Math.min(20_000, Math.ceil(opts.connections * 1.1) + 100);
  const conf = `
load_module ${MODULE};
daemon off;
master_process on;
worker_processes ${opts.workers ?? 1};
worker_rlimit_nofile ${files};
pid ${dir}/nginx.pid;
error_log stderr notice;
error_log ${dir}/error.log warn;
events {
  worker_connections ${files};
  multi_accept on;
}
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  nchan_shared_memory_size 256M;
  server {
    listen 127.0.0.1:${port} backlog=4096;
    location ~ ^/sub/([A-Za-z0-9_]+)$ {
      nchan_subscriber eventsource;
      nchan_channel_id $1;
      nchan_subscriber_first_message newest;
    }
    location ~ ^/pub/([A-Za-z0-9_]+)$ {
      nchan_publisher;
      nchan_channel_id $1;
      nchan_message_buffer_length 10;
      nchan_message_timeout 60s;
    }
  }
}
`;
  const file = join(dir, 'nginx.conf');
  writeFileSync(file, conf);
  const started = await startProcess('nginx', ['-p', dir, '-e', 'stderr', '-c', file], {
    ready: /start worker process \d+/,
    name: 'nginx (nchan)',
  });
  const pid = started.child.pid as number;
  return {
    port,
    pid,
    rss: () => rssOfTree(pid),
    errors: () => {
      try {
        return readFileSync(join(dir, 'error.log'), 'utf8').trim().split('\n').filter(Boolean).slice(-5);
      } catch {
        return [];
      }
    },
    async stop() {
      // QUIT is nginx's graceful stop, but held streams would keep it up: TERM is the fast one.
      await started.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
