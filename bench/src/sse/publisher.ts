/**
 * A publisher process for the peers (Nchan, the bare uWebSockets.js floor): POSTs
 * `t:<scheduled send time>` (and padding) to `/pub/<channel>` at a fixed rate, round robin
 * over the channels, over a few keep-alive connections. Forked by fanout.ts once per run: says
 * `{type: 'ready'}` when loaded, then answers each job with `{type: 'done', sent, failed, seconds}`.
 */
import { Agent, request } from 'node:http';

export interface PublishJob {
  type: 'publish';
  port: number;
  channels: string[];
  rate: number;
  seconds: number;
  padding: number;
  connections: number;
}

const now = () => performance.timeOrigin + performance.now();

async function publish(job: PublishJob): Promise<void> {
  const agent = new Agent({ keepAlive: true, maxSockets: job.connections });
  const pad = job.padding > 0 ? ` ${'x'.repeat(job.padding)}` : '';
  const total = Math.round(job.rate * job.seconds);
  const start = now();
  let issued = 0;
  let sent = 0;
  let failed = 0;
  const pending = new Set<Promise<void>>();
  const post = (channel: string, body: string) => {
    const p = new Promise<void>((resolve) => {
      const req = request(
        {
          agent,
          host: '127.0.0.1',
          port: job.port,
          method: 'POST',
          path: `/pub/${channel}`,
          headers: { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body) },
        },
        (res) => {
          res.resume();
          res.on('end', () => {
            if ((res.statusCode ?? 0) < 300) sent++;
            else failed++;
            resolve();
          });
        },
      );
      req.on('error', () => {
        failed++;
        resolve();
      });
      req.end(body);
    });
    pending.add(p);
    void p.then(() => pending.delete(p));
  };
  while (issued < total) {
    const due = Math.min(total, Math.floor(((now() - start) * job.rate) / 1000) + 1);
    for (; issued < due; issued++) {
      const sentAt = start + (issued * 1000) / job.rate;
      post(job.channels[issued % job.channels.length] as string, `t:${sentAt.toFixed(3)}${pad}`);
    }
    await new Promise((r) => setTimeout(r, 1));
  }
  await Promise.all(pending);
  agent.destroy();
  process.send?.({ type: 'done', sent, failed, seconds: (now() - start) / 1000 });
}

process.on('message', (m: PublishJob) => {
  if (m.type === 'publish') void publish(m);
});
process.on('disconnect', () => process.exit(0));
process.send?.({ type: 'ready' });
