import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import type { Test } from 'tap';

/** A request as the receiver saw it: the raw body and what arrived with it. */
export interface Received {
  path: string;
  headers: IncomingMessage['headers'];
  /** The TLS server name the client asked for (SNI). */
  servername: string | undefined;
  body: string;
}

/** How the receiver answers a path; `hold` answers only once `release` is called. */
export type Answer = { status: number; body?: string; headers?: Record<string, string> } | 'hold';

export interface Receiver {
  port: number;
  /** The CA that signed the receiver's certificate, for the client to trust (PEM). */
  ca: string;
  received: Received[];
  /** Requests held open right now. */
  readonly held: number;
  /** Answers every request held so far with `answer`. */
  release(answer: Exclude<Answer, 'hold'>): void;
}

/**
 * A local HTTPS receiver on 127.0.0.1 for the name `host`: its certificate names only `host`
 * and is signed by a CA made for this test with openssl, which the client must be told to
 * trust. `answer` decides each path's reply.
 */
export async function startReceiver(t: Test, host: string, answer: (path: string) => Answer): Promise<Receiver> {
  const dir = await mkdtemp(join(tmpdir(), 'svc-webhook-tls-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=svc test CA');
  openssl('req', ...ec, '-keyout', 'leaf.key', '-out', 'leaf.csr', '-subj', `/CN=${host}`);
  await writeFile(join(dir, 'leaf.ext'), `subjectAltName=DNS:${host}\nextendedKeyUsage=serverAuth\n`);
  openssl(
    'x509',
    '-req',
    '-in',
    'leaf.csr',
    '-CA',
    'ca.pem',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'leaf.pem',
    '-days',
    '2',
    '-extfile',
    'leaf.ext',
  );
  const read = (f: string) => readFile(join(dir, f), 'utf8');
  const [ca, cert, key] = [await read('ca.pem'), await read('leaf.pem'), await read('leaf.key')];
  const received: Received[] = [];
  const holding: ServerResponse[] = [];
  const reply = (res: ServerResponse, a: Exclude<Answer, 'hold'>) => {
    res.writeHead(a.status, { 'content-type': 'text/plain', ...a.headers });
    res.end(a.body ?? '');
  };
  const server = createServer({ cert, key }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = req.url ?? '/';
      received.push({
        path,
        headers: req.headers,
        servername: (req.socket as TLSSocket).servername || undefined,
        body: Buffer.concat(chunks).toString('utf8'),
      });
      const a = answer(path);
      if (a === 'hold') holding.push(res);
      else reply(res, a);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return {
    port: (server.address() as AddressInfo).port,
    ca,
    received,
    get held() {
      return holding.length;
    },
    release(a) {
      for (const res of holding.splice(0)) reply(res, a);
    },
  };
}
