import { randomBytes, timingSafeEqual } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import { chmod, chown, mkdtemp, rm } from 'node:fs/promises';
import {
  type ClientRequest,
  createServer,
  type IncomingMessage,
  request,
  type Server,
  type ServerResponse,
} from 'node:http';
import { request as httpsRequest } from 'node:https';
import {
  BlockList,
  connect,
  createServer as createNetServer,
  isIP,
  type Server as NetServer,
  type Socket,
} from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Duplex, type Readable, type Writable } from 'node:stream';
import { createSecureContext, TLSSocket } from 'node:tls';
import type { RunnerEgressRow } from '@svc/core';
import {
  type BrokerBinding,
  brokerHeaders,
  PLACEHOLDER_REFUSED,
  placeholderGuard,
  type SandboxBroker,
} from './broker.ts';
import { hostAllowed, normalHost, splitHostPort } from './hosts.ts';

/** Who a proxy credential belongs to, and what it may reach (null: any host). */
export interface EgressGrant {
  sandbox: string;
  incarnation: number;
  conversationId: string;
  allowedHosts: string[] | null;
  /**
   * Hosts always reached (the model provider's, the service's), also where `allowedHosts` is
   * null, and also on a loopback or private address.
   */
  reach?: string[];
}

/** A request the proxy refused: its host is not in the grant's allowlist, or it leads inside. */
export type OnRefused = (grant: EgressGrant, host: string, reason?: string) => void;

/** Whose a request through a brokered sandbox's egress was. */
export interface EgressSource {
  sandbox: string;
  incarnation: number;
  conversationId: string;
}

type Row = Omit<RunnerEgressRow, 'conversation_id' | 'at'>;

/** A row of a brokered sandbox's egress log (every request that left, every refusal). */
export type OnEgress = (source: EgressSource, row: Omit<RunnerEgressRow, 'conversation_id'>) => void;

/** Where a request the broker reads in the clear goes on to. */
interface BrokerTarget {
  protocol: 'http:' | 'https:';
  host: string;
  address: string;
  port: number;
  sandbox: string;
  /** The grant of a proxied request; absent for a loopback bridge's (the broker's conversation). */
  grant?: EgressGrant;
}

/**
 * Addresses an unrestricted grant does not lead to: the runner's own machine (loopback, where
 * the service's Postgres and Redis may listen), its private networks, link-local (cloud
 * metadata at 169.254.169.254) and the unspecified address. An allowlist entry or `reach`
 * naming the host opens it.
 */
const INSIDE = new BlockList();
for (const [net, bits] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.168.0.0', 16],
] as const) {
  INSIDE.addSubnet(net, bits, 'ipv4');
}
for (const [net, bits] of [
  ['::', 128],
  ['::1', 128],
  ['fc00::', 7],
  ['fe80::', 10],
] as const) {
  INSIDE.addSubnet(net, bits, 'ipv6');
}

/** Whether `address` (an IP) is on the runner's machine or a network inside (see INSIDE). */
export function insideAddress(address: string): boolean {
  const v4mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
  if (v4mapped) return INSIDE.check(v4mapped, 'ipv4');
  const family = isIP(address);
  return family === 4 ? INSIDE.check(address, 'ipv4') : family === 6 ? INSIDE.check(address, 'ipv6') : false;
}

/**
 * Where a request of `grant` to `host:port` goes: the address to connect to, or why it is
 * refused. A host named by the allowlist or `reach` is connected to as it is; one allowed only
 * because the grant is unrestricted must resolve to public addresses only (so a name pointing
 * at 127.0.0.1 reaches nothing of the machine either).
 */
export async function destination(
  grant: EgressGrant,
  host: string,
  port: number,
): Promise<{ address: string } | { refused: string }> {
  const named = hostAllowed([...(grant.allowedHosts ?? []), ...(grant.reach ?? [])], host, port);
  if (named) return { address: normalHost(host) };
  if (grant.allowedHosts !== null) return { refused: 'not in allowed_hosts' };
  const name = normalHost(host);
  let addresses: string[];
  try {
    addresses = isIP(name) ? [name] : (await lookup(name, { all: true })).map((a) => a.address);
  } catch (err) {
    return { refused: `cannot resolve: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}` };
  }
  if (addresses.length === 0 || addresses.some(insideAddress)) return { refused: 'a private or loopback address' };
  return { address: addresses[0] as string };
}

const USER = 'svc';

/**
 * The runner's allow-listing forward proxy: one HTTP server on 127.0.0.1 (an ephemeral port)
 * for every sandbox of the runner. Each grant has its own credential, sent as Basic
 * `Proxy-Authorization` (the user:password in `HTTP_PROXY`, which curl, Go, Python, undici and
 * Claude Code all send), so a sandbox cannot borrow another's allowlist and a local process
 * without a credential gets 407. One port, not one per sandbox, so the firewall's loopback
 * exception and the runner's footprint do not grow with the sandboxes.
 *
 * It tunnels `CONNECT host:port` (HTTPS and anything else over TLS) and forwards absolute-form
 * `http://` requests. A host outside the grant's allowlist gets 403 with a plain-text body
 * naming it, and `onRefused` hears of it; the target is never contacted.
 */
export class EgressProxy {
  private readonly grants = new Map<string, EgressGrant>();
  private readonly sockets = new Set<Socket>();
  /** Each isolated sandbox's bridge listeners and their socket directory. */
  private readonly bridges = new Map<string, { dir: string; servers: NetServer[] }>();
  /** Each brokered sandbox's broker, by sandbox, with the incarnation it was prepared for. */
  private readonly brokers = new Map<string, { incarnation: number; broker: SandboxBroker }>();
  /** Where requests read in the clear (a brokered sandbox's TLS, its loopback bridges) are served. */
  private readonly clear: Server = createServer((req, res) => this.brokered(req, res)).on(
    'upgrade',
    (req: IncomingMessage, socket: Duplex, head: Buffer) => this.brokeredUpgrade(req, socket, head),
  );
  /** What each connection the broker reads in the clear leads to (a socket, TLS, or a replay). */
  private readonly targets = new WeakMap<object, BrokerTarget>();
  private onRefused: OnRefused = () => {};
  private onEgress: OnEgress = () => {};

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(onRefused: OnRefused = () => {}, onEgress: OnEgress = () => {}): Promise<EgressProxy> {
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    const address = server.address();
    const proxy = new EgressProxy(server, typeof address === 'object' && address ? address.port : 0);
    proxy.onRefused = onRefused;
    proxy.onEgress = onEgress;
    server.on('connection', (socket: Socket) => {
      proxy.sockets.add(socket);
      socket.once('close', () => proxy.sockets.delete(socket));
    });
    server.on('request', (req: IncomingMessage, res: ServerResponse) => proxy.forward(req, res, onRefused));
    server.on('connect', (req: IncomingMessage, socket: Socket, head: Buffer) =>
      proxy.tunnel(req, socket, head, onRefused),
    );
    return proxy;
  }

  /**
   * A credential for `grant`, as the proxy URL a process is given
   * (`http://svc:<secret>@127.0.0.1:<port>`; `port` is the proxy's bridge inside an isolated
   * sandbox). It stays valid until `revoke` of its sandbox.
   */
  grant(grant: EgressGrant, port = this.port): string {
    const secret = randomBytes(24).toString('hex');
    this.grants.set(secret, grant);
    return `http://${USER}:${secret}@127.0.0.1:${port}`;
  }

  /**
   * Opens the bridges of an isolated sandbox (see Isolation): a new directory of Unix sockets,
   * owned by `user`, that the sandbox sees as its /run/svc. `<port>.sock` for the proxy (its
   * port inside the sandbox is `proxyPort`, the first from 3128 that is not forwarded) leads
   * into this proxy, as its TCP port does; each of `forwards` (ports on the runner's
   * loopback the sandbox always reaches: the service's, a local model provider's) leads
   * straight to 127.0.0.1:<port>. Replaces the sandbox's earlier bridges.
   */
  async bridge(
    sandbox: string,
    forwards: number[],
    user?: { uid: number; gid: number },
  ): Promise<{ socketDir: string; ports: number[]; proxyPort: number }> {
    await this.closeBridges(sandbox);
    let proxyPort = 3128;
    while (forwards.includes(proxyPort)) proxyPort += 1;
    const dir = await mkdtemp(join(tmpdir(), 'svce-'));
    const servers: NetServer[] = [];
    this.bridges.set(sandbox, { dir, servers });
    const listen = async (port: number, onSocket: (s: Socket) => void) => {
      const server = createNetServer(onSocket);
      servers.push(server);
      const path = join(dir, `${port}.sock`);
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(path, () => resolve());
      });
      if (user) await chown(path, user.uid, user.gid);
    };
    await listen(proxyPort, (socket) => this.server.emit('connection', socket));
    for (const port of forwards) {
      await listen(port, (socket) => {
        socket.on('error', () => socket.destroy());
        // A brokered sandbox's requests to the service or a local model provider are read, so
        // their bound secrets (the inference credential) are written in and they are logged.
        if (this.brokers.has(sandbox)) {
          this.targets.set(socket, { protocol: 'http:', host: '127.0.0.1', address: '127.0.0.1', port, sandbox });
          this.clear.emit('connection', socket);
          return;
        }
        const upstream = connect(port, '127.0.0.1');
        upstream.on('error', () => socket.destroy());
        socket.once('close', () => upstream.destroy());
        upstream.once('close', () => socket.destroy());
        socket.pipe(upstream).pipe(socket);
      });
    }
    if (user) await chown(dir, user.uid, user.gid);
    await chmod(dir, 0o700);
    return { socketDir: dir, ports: [proxyPort, ...forwards], proxyPort };
  }

  private async closeBridges(sandbox: string): Promise<void> {
    const held = this.bridges.get(sandbox);
    if (!held) return;
    this.bridges.delete(sandbox);
    await Promise.all(held.servers.map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
    await rm(held.dir, { recursive: true, force: true });
  }

  /**
   * Every credential of `sandbox` stops working and its bridges close (its tunnels already
   * open are left to end).
   */
  async revoke(sandbox: string): Promise<void> {
    for (const [secret, grant] of this.grants) if (grant.sandbox === sandbox) this.grants.delete(secret);
    this.brokers.delete(sandbox);
    await this.closeBridges(sandbox);
  }

  /**
   * From now on the sandbox's requests go through `broker` (until `revoke`): TLS its processes
   * open is terminated with a certificate of the sandbox's own CA and read, bound secrets are
   * written for their hosts, a placeholder elsewhere is refused, and each request is logged.
   */
  setBroker(sandbox: string, incarnation: number, broker: SandboxBroker): void {
    this.brokers.set(sandbox, { incarnation, broker });
  }

  /** Logs a row of a brokered sandbox's egress (nothing for one without a broker). */
  private log(sandbox: string, grant: EgressGrant | undefined, row: Row): void {
    const held = this.brokers.get(sandbox);
    if (!held) return;
    const source = {
      sandbox,
      incarnation: grant?.incarnation ?? held.incarnation,
      conversationId: grant?.conversationId ?? held.broker.conversationId,
    };
    this.onEgress(source, { ...row, at: new Date().toISOString() });
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await Promise.all([...this.bridges.keys()].map((s) => this.closeBridges(s)));
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private authorized(req: IncomingMessage): EgressGrant | undefined {
    const header = req.headers['proxy-authorization'];
    const m = typeof header === 'string' ? /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(header.trim()) : null;
    if (!m?.[1]) return undefined;
    const decoded = Buffer.from(m[1], 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 0 || decoded.slice(0, colon) !== USER) return undefined;
    const given = Buffer.from(decoded.slice(colon + 1));
    for (const [secret, grant] of this.grants) {
      const want = Buffer.from(secret);
      if (want.length === given.length && timingSafeEqual(want, given)) return grant;
    }
    return undefined;
  }

  private tunnel(req: IncomingMessage, socket: Socket, head: Buffer, onRefused: OnRefused): void {
    socket.on('error', () => socket.destroy());
    const target = splitHostPort(req.url ?? '');
    const grant = this.authorized(req);
    if (!grant) {
      rawReply(socket, 407, 'svc-runner: proxy credentials missing or unknown\n');
      return;
    }
    if (!target || target.port === null) {
      rawReply(socket, 400, 'svc-runner: CONNECT needs host:port\n');
      return;
    }
    const { host, port } = target;
    void destination(grant, host, port).then((to) => {
      if ('refused' in to) {
        onRefused(grant, host, to.refused);
        this.log(grant.sandbox, grant, refusedRow(host, port, 'CONNECT', to.refused));
        rawReply(socket, 403, refusedBody(host, to.refused));
        return;
      }
      if (this.brokers.has(grant.sandbox))
        void this.intercept(socket, head, { host, port, address: to.address, grant });
      else this.open(req, socket, head, to.address, port);
    });
  }

  /**
   * A brokered sandbox's tunnel: TLS (its first byte a handshake) is terminated with a leaf
   * certificate for the host from the sandbox's CA and its requests are served in the clear
   * (`brokered`); anything else (plain http some clients tunnel too) is tunnelled as it is, and
   * logged as one CONNECT.
   */
  private async intercept(
    socket: Socket,
    head: Buffer,
    to: { host: string; port: number; address: string; grant: EgressGrant },
  ): Promise<void> {
    const held = this.brokers.get(to.grant.sandbox);
    if (!held || socket.destroyed) return;
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    const first =
      head.length > 0
        ? head
        : await new Promise<Buffer | undefined>((resolve) => {
            socket.once('data', (d: Buffer) => {
              socket.pause();
              resolve(d);
            });
            socket.once('close', () => resolve(undefined));
          });
    if (!first || socket.destroyed) return;
    if (first[0] !== 0x16) {
      if (HTTP_REQUEST_START.test(first.subarray(0, 16).toString('latin1'))) {
        // Plain http through the tunnel: read and brokered like any other request.
        const plain = replaying(socket, first);
        this.targets.set(plain, {
          protocol: 'http:',
          host: normalHost(to.host),
          address: to.address,
          port: to.port,
          sandbox: to.grant.sandbox,
          grant: to.grant,
        });
        this.clear.emit('connection', plain);
        return;
      }
      // Another protocol: passed on as it is, but never with a placeholder in it.
      const started = Date.now();
      const upstream = connect(to.port, to.address);
      upstream.once('connect', () => {
        this.log(to.grant.sandbox, to.grant, row(to.host, to.port, 'CONNECT', null, 200, Date.now() - started));
        const out = placeholderGuard(held.broker.bindings);
        out.on('error', () => {
          this.onRefused(to.grant, to.host, PLACEHOLDER_REFUSED);
          this.log(to.grant.sandbox, to.grant, refusedRow(to.host, to.port, 'CONNECT', PLACEHOLDER_REFUSED));
          upstream.destroy();
          socket.destroy();
        });
        out.write(first);
        socket.pipe(out).pipe(upstream).pipe(socket);
        socket.resume();
      });
      upstream.once('error', () => socket.destroy());
      socket.once('close', () => upstream.destroy());
      return;
    }
    const host = normalHost(to.host);
    const leaf = await held.broker.ca.leaf(host);
    if (socket.destroyed) return;
    // TLS over a stream that gives the bytes already read first, then the socket's: a TLS
    // socket made on the socket itself would read from its handle and miss them.
    const tls = new TLSSocket(replaying(socket, first), {
      isServer: true,
      secureContext: createSecureContext({ key: leaf.key, cert: leaf.cert }),
    });
    tls.on('error', () => tls.destroy());
    this.targets.set(tls, {
      protocol: 'https:',
      host,
      address: to.address,
      port: to.port,
      sandbox: to.grant.sandbox,
      grant: to.grant,
    });
    this.clear.emit('connection', tls);
  }

  /**
   * A request of a brokered sandbox read in the clear: its bound secrets written for the host,
   * refused (403) when a placeholder would leave for another, else sent on to the real host
   * (over TLS when it came over TLS, verified against the runner's trust) and logged.
   */
  private brokered(req: IncomingMessage, res: ServerResponse): void {
    const p = this.prepare(req);
    if ('status' in p) {
      res.writeHead(p.status, { 'content-type': 'text/plain', connection: 'close' }).end(p.body);
      return;
    }
    const { target, upstream } = p;
    upstream.on('response', (answer) => {
      this.log(target.sandbox, target.grant, p.row(answer.statusCode ?? 0));
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    let refused = false;
    upstream.on('error', (err) => {
      if (refused) return;
      this.log(target.sandbox, target.grant, { ...p.row(null), reason: `cannot reach it: ${err.message}` });
      if (!res.headersSent) {
        res
          .writeHead(502, { 'content-type': 'text/plain' })
          .end(`svc-runner: cannot reach ${target.host}: ${err.message}\n`);
      } else res.destroy();
    });
    this.sendBody(req, upstream, p.bindings, () => {
      refused = true;
      this.refusedClear(target, p.method, PLACEHOLDER_REFUSED);
      refuse(res, target.host, PLACEHOLDER_REFUSED);
    });
  }

  /**
   * A request of a brokered sandbox read in the clear, made ready to go on: its target, its
   * headers with the bound secrets written for the host, and the request to the real host
   * (over TLS when it came over TLS, verified against the runner's trust; not ended), with
   * the log row it makes once answered. Or, refused (logged, and heard by onRefused), the
   * status and text to answer it with.
   */
  private prepare(req: IncomingMessage):
    | {
        target: BrokerTarget;
        method: string;
        bindings: readonly BrokerBinding[];
        upstream: ClientRequest;
        /** Its log row with the status it got (null: none came), timed from now. */
        row: (status: number | null) => Row;
      }
    | { status: number; body: string } {
    const target = this.targets.get(req.socket);
    const held = target ? this.brokers.get(target.sandbox) : undefined;
    if (!target || !held) return { status: 502, body: 'svc-runner: no broker\n' };
    const method = req.method ?? 'GET';
    const headers = { ...req.headers };
    const outcome = brokerHeaders(headers, req.url ?? '', target.host, target.port, held.broker.bindings);
    if (!outcome.ok) {
      this.refusedClear(target, method, outcome.reason);
      return { status: 403, body: refusedBody(target.host, outcome.reason) };
    }
    const bindingId = outcome.binding?.binding_id ?? null;
    const started = Date.now();
    const send = target.protocol === 'https:' ? httpsRequest : request;
    const upstream = send({
      host: target.address,
      port: target.port,
      method,
      path: req.url,
      headers,
      ...(target.protocol === 'https:' && !isIP(target.host) ? { servername: target.host } : {}),
    });
    return {
      target,
      method,
      bindings: held.broker.bindings,
      upstream,
      row: (status) => row(target.host, target.port, method, bindingId, status, Date.now() - started),
    };
  }

  /** A request read in the clear refused: logged, and heard by onRefused. */
  private refusedClear(target: BrokerTarget, method: string, reason: string): void {
    if (target.grant) this.onRefused(target.grant, target.host, reason);
    this.log(target.sandbox, target.grant, refusedRow(target.host, target.port, method, reason));
  }

  /**
   * Pipes a brokered request's body to `upstream` through a placeholderGuard; a placeholder in
   * it ends the upstream request before the placeholder leaves, and `onRefused` answers.
   */
  private sendBody(
    body: Readable,
    upstream: Writable & { destroy(): void },
    bindings: readonly BrokerBinding[],
    onRefused: () => void,
  ): void {
    const guard = placeholderGuard(bindings);
    guard.once('error', () => {
      body.unpipe(guard);
      upstream.destroy();
      onRefused();
    });
    body.pipe(guard).pipe(upstream);
  }

  /**
   * An upgrade (a WebSocket) of a brokered sandbox read in the clear: brokered as a request
   * is, sent on to the real host, and its answer passed back; once switched, the two sides are
   * joined, what the sandbox sends still watched for placeholders.
   */
  private brokeredUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on('error', () => socket.destroy());
    const p = this.prepare(req);
    if ('status' in p) {
      rawReply(socket, p.status, p.body);
      return;
    }
    const { target, upstream } = p;
    const answer = (status: number, message: string, rawHeaders: string[], closing: boolean) => {
      this.log(target.sandbox, target.grant, p.row(status));
      let text = `HTTP/1.1 ${status} ${message}\r\n`;
      for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
        const name = (rawHeaders[i] as string).toLowerCase();
        // A body passed back decoded ends with the connection instead.
        if (closing && (name === 'transfer-encoding' || name === 'connection')) continue;
        text += `${rawHeaders[i]}: ${rawHeaders[i + 1]}\r\n`;
      }
      socket.write(`${text}${closing ? 'Connection: close\r\n' : ''}\r\n`);
    };
    upstream.on('upgrade', (res, upstreamSocket, upstreamHead) => {
      answer(res.statusCode ?? 101, res.statusMessage ?? 'Switching Protocols', res.rawHeaders, false);
      if (upstreamHead.length > 0) socket.write(upstreamHead);
      upstreamSocket.on('error', () => socket.destroy());
      socket.once('close', () => upstreamSocket.destroy());
      upstreamSocket.once('close', () => socket.destroy());
      upstreamSocket.pipe(socket);
      const out = placeholderGuard(p.bindings);
      out.once('error', () => {
        this.refusedClear(target, p.method, PLACEHOLDER_REFUSED);
        upstreamSocket.destroy();
        socket.destroy();
      });
      if (head.length > 0) out.write(head);
      socket.pipe(out).pipe(upstreamSocket);
    });
    upstream.on('response', (res) => {
      // Not switched: the answer goes back as it is, and the connection closes after it.
      answer(res.statusCode ?? 502, res.statusMessage ?? '', res.rawHeaders, true);
      res.pipe(socket);
    });
    upstream.on('error', (err) => {
      this.log(target.sandbox, target.grant, { ...p.row(null), reason: `cannot reach it: ${err.message}` });
      rawReply(socket, 502, `svc-runner: cannot reach ${target.host}: ${err.message}\n`);
    });
    upstream.end();
  }

  private open(req: IncomingMessage, socket: Socket, head: Buffer, address: string, port: number): void {
    if (socket.destroyed) return;
    const upstream = connect(port, address);
    let open = false;
    upstream.once('connect', () => {
      open = true;
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length > 0) upstream.write(head);
      upstream.pipe(socket);
      socket.pipe(upstream);
    });
    upstream.once('error', (err) => {
      if (!open) rawReply(socket, 502, `svc-runner: cannot reach ${req.url}: ${err.message}\n`);
      else socket.destroy();
    });
    socket.once('close', () => upstream.destroy());
  }

  private forward(req: IncomingMessage, res: ServerResponse, onRefused: OnRefused): void {
    const grant = this.authorized(req);
    if (!grant) {
      res.writeHead(407, { 'content-type': 'text/plain', 'proxy-authenticate': 'Basic realm="svc-runner"' });
      res.end('svc-runner: proxy credentials missing or unknown\n');
      return;
    }
    let url: URL;
    try {
      url = new URL(req.url ?? '');
    } catch {
      res.writeHead(400, { 'content-type': 'text/plain' }).end('svc-runner: a proxy request needs an absolute URL\n');
      return;
    }
    if (url.protocol !== 'http:') {
      res.writeHead(400, { 'content-type': 'text/plain' }).end('svc-runner: use CONNECT for anything but http://\n');
      return;
    }
    const port = url.port ? Number(url.port) : 80;
    // The body waits while the destination is looked up.
    req.pause();
    void destination(grant, url.hostname, port).then((to) => {
      if ('refused' in to) {
        onRefused(grant, url.hostname, to.refused);
        this.log(grant.sandbox, grant, refusedRow(url.hostname, port, req.method ?? 'GET', to.refused));
        res
          .writeHead(403, { 'content-type': 'text/plain', connection: 'close' })
          .end(refusedBody(url.hostname, to.refused));
        return;
      }
      this.send(req, res, url, to.address, port, grant);
    });
  }

  private send(
    req: IncomingMessage,
    res: ServerResponse,
    url: URL,
    address: string,
    port: number,
    grant: EgressGrant,
  ): void {
    const headers = { ...req.headers };
    delete headers['proxy-authorization'];
    delete headers['proxy-connection'];
    const method = req.method ?? 'GET';
    const held = this.brokers.get(grant.sandbox);
    let bindingId: string | null = null;
    if (held) {
      const outcome = brokerHeaders(headers, req.url ?? '', url.hostname, port, held.broker.bindings);
      if (!outcome.ok) {
        this.onRefused(grant, url.hostname, outcome.reason);
        this.log(grant.sandbox, grant, refusedRow(url.hostname, port, method, outcome.reason));
        refuse(res, url.hostname, outcome.reason);
        return;
      }
      bindingId = outcome.binding?.binding_id ?? null;
    }
    const started = Date.now();
    const upstream = request(
      { host: address, port, method, path: `${url.pathname}${url.search}`, headers },
      (answer) => {
        this.log(
          grant.sandbox,
          grant,
          row(url.hostname, port, method, bindingId, answer.statusCode ?? 0, Date.now() - started),
        );
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    let refused = false;
    upstream.on('error', (err) => {
      if (refused) return;
      if (!res.headersSent) {
        res
          .writeHead(502, { 'content-type': 'text/plain' })
          .end(`svc-runner: cannot reach ${url.host}: ${err.message}\n`);
      } else res.destroy();
    });
    if (!held) {
      req.pipe(upstream);
      return;
    }
    this.sendBody(req, upstream, held.broker.bindings, () => {
      refused = true;
      this.onRefused(grant, url.hostname, PLACEHOLDER_REFUSED);
      this.log(grant.sandbox, grant, refusedRow(url.hostname, port, method, PLACEHOLDER_REFUSED));
      refuse(res, url.hostname, PLACEHOLDER_REFUSED);
    });
  }
}

/** A request line's start: an upper-case method and a space (what a plain http client sends first). */
const HTTP_REQUEST_START = /^[A-Z]{3,10} /;

/** Answers 403 naming why, or, when the answer has begun, cuts it off. */
function refuse(res: ServerResponse, host: string, reason: string): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.writeHead(403, { 'content-type': 'text/plain', connection: 'close' }).end(refusedBody(host, reason));
}

/** A duplex over `socket` whose readable side gives `first`, then what the socket reads. */
function replaying(socket: Socket, first: Buffer): Duplex {
  const stream = new Duplex({
    read() {
      socket.resume();
    },
    write(chunk, encoding, done) {
      socket.write(chunk, encoding, done);
    },
    final(done) {
      socket.end();
      done();
    },
    destroy(err, done) {
      socket.destroy();
      done(err);
    },
  });
  stream.push(first);
  socket.on('data', (chunk: Buffer) => {
    if (!stream.push(chunk)) socket.pause();
  });
  socket.once('end', () => stream.push(null));
  socket.once('close', () => stream.destroy());
  return stream;
}

function row(
  host: string,
  port: number,
  method: string,
  bindingId: string | null,
  status: number | null,
  latencyMs: number,
): Row {
  return { host, port, method, binding_id: bindingId, status, latency_ms: latencyMs, refused: false, reason: null };
}

function refusedRow(host: string, port: number, method: string, reason: string): Row {
  return { host, port, method, binding_id: null, status: null, latency_ms: null, refused: true, reason };
}

function refusedBody(host: string, reason: string): string {
  if (reason === 'not in allowed_hosts')
    return `svc-runner: ${host} is not in this sandbox's allowed_hosts (the environment's networking_config)\n`;
  if (reason === PLACEHOLDER_REFUSED) return `svc-runner: the request to ${host} is refused: ${reason}\n`;
  return `svc-runner: ${host} is refused: ${reason} (only an allowed_hosts entry naming it reaches it)\n`;
}

const REASONS: Record<number, string> = {
  400: 'Bad Request',
  403: 'Forbidden',
  407: 'Proxy Authentication Required',
  502: 'Bad Gateway',
};

function rawReply(socket: Duplex, status: number, body: string): void {
  const extra = status === 407 ? 'Proxy-Authenticate: Basic realm="svc-runner"\r\n' : '';
  socket.end(
    `HTTP/1.1 ${status} ${REASONS[status]}\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}Connection: close\r\n\r\n${body}`,
  );
}
