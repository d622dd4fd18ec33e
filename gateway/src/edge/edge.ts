import uWS from 'uWebSockets.js';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { AdmissionMetrics } from '../metrics.ts';
import { admission } from '../ratelimit/admission.ts';
import type { RateLimiter } from '../ratelimit/ratelimit.ts';
import type { StreamServer } from '../streams/streams.ts';
import { canonicalIp } from './client-ip.ts';
import type { Forwarder } from './forward.ts';
import { registerRunnerSocket } from './runners.ts';
import { registerSse } from './sse.ts';

export interface EdgeOptions {
  host: string;
  port: number;
  limiter: RateLimiter | undefined;
  rateLimitExempt: readonly string[];
  /** Where the rate limit's refusals are counted. */
  metrics?: AdmissionMetrics;
  forwarder: Forwarder;
  log: Logger;
  /** Streams the edge serves itself; without it every request is forwarded. */
  streams?: StreamServer;
  /** The runner fabric, whose WebSocket transport the edge serves. */
  fabric?: RunnerFabric;
}

export interface Edge {
  port: number;
  /** Stops accepting connections, waits for requests under way (up to `graceMs`), then closes. */
  close(graceMs: number): Promise<void>;
}

/**
 * The only public listener. Every path of `/api` is rate limited here, per client IP, before
 * anything else happens (streams count once, at open). Requests the edge does not serve
 * itself are forwarded to the api role.
 */
export async function startEdge(options: EdgeOptions): Promise<Edge> {
  const { limiter, forwarder, log } = options;

  const admitFor = admission(limiter, options.rateLimitExempt, log, options.metrics);

  const app = uWS.App();
  const { streams } = options;
  if (streams) registerSse(app, streams, admitFor);
  if (options.fabric) registerRunnerSocket(app, options.fabric, admitFor, log);
  app.any('/*', (res, req) => {
    const ip = canonicalIp(Buffer.from(res.getRemoteAddressAsText()).toString());
    forwarder.forward(res, req, ip, admitFor(ip, req.getUrl()));
  });

  const listenSocket = await new Promise<uWS.us_listen_socket>((resolve, reject) => {
    app.listen(options.host, options.port, (socket) => {
      if (socket) resolve(socket);
      else reject(new Error(`the edge could not listen on ${options.host}:${options.port}`));
    });
  });
  const port = uWS.us_socket_local_port(listenSocket);

  return {
    port,
    async close(graceMs: number) {
      uWS.us_listen_socket_close(listenSocket);
      streams?.close();
      const deadline = Date.now() + graceMs;
      while (forwarder.inFlight > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      // Present at run time in this build though missing from its typings: closes every socket.
      (app as unknown as { close(): void }).close();
    },
  };
}
