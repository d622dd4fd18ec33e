import uWS from 'uWebSockets.js';
import type { Logger } from 'pino';
import type { RunnerFabric } from '../fabric/fabric.ts';
import type { AdmissionMetrics } from '../metrics.ts';
import { portInUse, portTaken } from '../processes/in-use.ts';
import { admission } from '../ratelimit/admission.ts';
import type { RateLimiter } from '../ratelimit/ratelimit.ts';
import { REQUEST_ID_HEADER, requestId } from '../request-id.ts';
import type { StreamServer } from '../streams/streams.ts';
import { edgeClientOf } from './client-ip.ts';
import type { Forwarder } from './forward.ts';
import { registerRunnerSocket } from './runners.ts';
import { registerSse } from './sse.ts';

export interface EdgeOptions {
  host: string;
  port: number;
  /**
   * Who may listen on this port beside this process. `alone` (the default) binds exclusively,
   * so neither another instance nor this one can share it. `group-first` is the first process
   * of an EDGE_PROCESSES group: it refuses a port anyone holds, then binds with SO_REUSEPORT
   * for the rest of its group (`group-member`), which joins without the check.
   */
  sharing?: 'alone' | 'group-first' | 'group-member';
  limiter: RateLimiter | undefined;
  rateLimitExempt: readonly string[];
  /** Where the rate limit's refusals are counted. */
  metrics?: AdmissionMetrics;
  /** TRUST_PROXY: proxies (CIDRs) whose X-Forwarded-For names the client; none by default. */
  trustProxy?: readonly string[];
  forwarder: Forwarder;
  log: Logger;
  /** Streams the edge serves itself; without it every request is forwarded. */
  streams?: StreamServer;
  /** The runner fabric, whose WebSocket transport the edge serves. */
  fabric?: RunnerFabric;
}

/**
 * uWS's LIBUS_LISTEN_EXCLUSIVE_PORT: bind without SO_REUSEPORT. The native listen takes it
 * after a host too, though this build's typings know only `listen(port, options, cb)`.
 */
const EXCLUSIVE_PORT = 1;
type ListenWithOptions = {
  listen(host: string, port: number, options: number, cb: (socket: uWS.us_listen_socket | false) => void): void;
};

export interface Edge {
  port: number;
  /** Stops accepting connections, tells runners going_away, waits for requests under way (up to `graceMs`), then closes. */
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
  const clientOf = edgeClientOf(options.trustProxy ?? []);
  if (streams) registerSse(app, streams, admitFor, log, clientOf);
  if (options.fabric) registerRunnerSocket(app, options.fabric, admitFor, log, clientOf);
  app.any('/*', (res, req) => {
    const ip = clientOf(res, req);
    forwarder.forward(res, req, ip, admitFor(ip, req.getUrl()), requestId(req.getHeader(REQUEST_ID_HEADER)));
  });

  const { host } = options;
  const sharing = options.sharing ?? 'alone';
  // uWS binds with SO_REUSEPORT unless told otherwise, and a second instance would then bind
  // the same port happily and take half of its connections.
  if (sharing === 'group-first' && options.port !== 0 && (await portTaken(host, options.port))) {
    throw await portInUse(host, options.port);
  }
  const listenSocket = await new Promise<uWS.us_listen_socket | false>((resolve) => {
    if (sharing === 'alone') (app as unknown as ListenWithOptions).listen(host, options.port, EXCLUSIVE_PORT, resolve);
    else app.listen(host, options.port, resolve);
  });
  if (!listenSocket) {
    if (options.port !== 0 && (await portTaken(host, options.port).catch(() => false))) {
      throw await portInUse(host, options.port);
    }
    throw new Error(`the edge could not listen on ${host}:${options.port}`);
  }
  const port = uWS.us_socket_local_port(listenSocket);

  return {
    port,
    async close(graceMs: number) {
      uWS.us_listen_socket_close(listenSocket);
      // Runners hear 1001 going_away and reconnect, to another node if there is one; the
      // app's close below would cut their sockets with no code.
      options.fabric?.shutdown();
      streams?.close();
      const deadline = Date.now() + graceMs;
      while (forwarder.inFlight > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      // Present at run time in this build though missing from its typings: closes every socket.
      (app as unknown as { close(): void }).close();
    },
  };
}
