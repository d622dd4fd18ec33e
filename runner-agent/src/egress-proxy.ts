import { randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, request, type Server, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';

/** Who a proxy credential belongs to, and what it may reach (null: any host). */
export interface EgressGrant {
  sandbox: string;
  incarnation: number;
  conversationId: string;
  allowedHosts: string[] | null;
}

/** A request the proxy refused because its host is not in the grant's allowlist. */
export type OnRefused = (grant: EgressGrant, host: string) => void;

const USER = 'svc';

/**
 * Whether `host:port` is in `allowed`. An entry is `host`, `host:port`, `[v6]`, `[v6]:port`, or
 * `*.domain` (any subdomain of `domain`, at any depth, but not `domain` itself), compared
 * without case and without a trailing dot. An entry without a port allows every port.
 * Null allows everything; an empty list nothing.
 */
export function hostAllowed(allowed: string[] | null, host: string, port: number): boolean {
  if (allowed === null) return true;
  const name = normalHost(host);
  return allowed.some((entry) => {
    const e = splitHostPort(entry);
    if (!e || (e.port !== null && e.port !== port)) return false;
    const pattern = normalHost(e.host);
    if (pattern.startsWith('*.')) return name.endsWith(pattern.slice(1)) && name.length > pattern.length - 1;
    return name === pattern;
  });
}

function normalHost(host: string): string {
  const h = host.toLowerCase().replace(/\.$/, '');
  return h.startsWith('[') && h.endsWith(']') ? h.slice(1, -1) : h;
}

/** `host:port`, `host`, `[v6]:port` or `[v6]` into its parts; null when malformed. */
export function splitHostPort(value: string): { host: string; port: number | null } | null {
  const m = /^(\[[0-9A-Fa-f:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(value);
  if (!m?.[1]) return null;
  const port = m[2] === undefined ? null : Number(m[2]);
  if (port !== null && (port < 1 || port > 65_535)) return null;
  return { host: m[1], port };
}

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

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(onRefused: OnRefused = () => {}): Promise<EgressProxy> {
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    const address = server.address();
    const proxy = new EgressProxy(server, typeof address === 'object' && address ? address.port : 0);
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
   * A credential for `grant`, as the proxy URL a process is given (`http://svc:<secret>@127.0.0.1:<port>`).
   * It stays valid until `revoke` of its sandbox.
   */
  grant(grant: EgressGrant): string {
    const secret = randomBytes(24).toString('hex');
    this.grants.set(secret, grant);
    return `http://${USER}:${secret}@127.0.0.1:${this.port}`;
  }

  /** Every credential of `sandbox` stops working (its tunnels already open are left to end). */
  revoke(sandbox: string): void {
    for (const [secret, grant] of this.grants) if (grant.sandbox === sandbox) this.grants.delete(secret);
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
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
    if (!hostAllowed(grant.allowedHosts, target.host, target.port)) {
      onRefused(grant, target.host);
      rawReply(socket, 403, refusedBody(target.host));
      return;
    }
    const upstream = connect(target.port, normalHost(target.host));
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
    if (!hostAllowed(grant.allowedHosts, url.hostname, port)) {
      onRefused(grant, url.hostname);
      res.writeHead(403, { 'content-type': 'text/plain', connection: 'close' }).end(refusedBody(url.hostname));
      return;
    }
    const headers = { ...req.headers };
    delete headers['proxy-authorization'];
    delete headers['proxy-connection'];
    const upstream = request(
      { host: normalHost(url.hostname), port, method: req.method, path: `${url.pathname}${url.search}`, headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on('error', (err) => {
      if (!res.headersSent) {
        res
          .writeHead(502, { 'content-type': 'text/plain' })
          .end(`svc-runner: cannot reach ${url.host}: ${err.message}\n`);
      } else res.destroy();
    });
    req.pipe(upstream);
  }
}

function refusedBody(host: string): string {
  return `svc-runner: ${host} is not in this sandbox's allowed_hosts (the environment's networking_config)\n`;
}

const REASONS: Record<number, string> = {
  400: 'Bad Request',
  403: 'Forbidden',
  407: 'Proxy Authentication Required',
  502: 'Bad Gateway',
};

function rawReply(socket: Socket, status: number, body: string): void {
  const extra = status === 407 ? 'Proxy-Authenticate: Basic realm="svc-runner"\r\n' : '';
  socket.end(
    `HTTP/1.1 ${status} ${REASONS[status]}\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}Connection: close\r\n\r\n${body}`,
  );
}
