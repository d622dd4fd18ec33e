// @peculiar/x509's dependency injection (tsyringe) needs the Reflect metadata polyfill loaded first.
import 'reflect-metadata';
import { webcrypto } from 'node:crypto';
import { isIP } from 'node:net';
import { PassThrough, Transform } from 'node:stream';
import * as x509 from '@peculiar/x509';
import type { BrokerBinding } from '@svc/core';
import { hostAllowed } from './hosts.ts';

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

export type { BrokerBinding };

/** What the broker made of one request's headers: the binding it wrote, or why it refuses. */
export type Brokered = { ok: true; binding: BrokerBinding | undefined } | { ok: false; reason: string };

/** Where Linux distributions keep the system's trust bundle (Debian and Ubuntu's first). */
export const SYSTEM_TRUST_BUNDLES = [
  '/etc/ssl/certs/ca-certificates.crt',
  '/etc/pki/tls/certs/ca-bundle.crt',
  '/etc/ssl/cert.pem',
] as const;

export const PLACEHOLDER_REFUSED = 'a secret placeholder sent to a host it is not bound to';

/**
 * Writes the bound secrets of `host:port` into `headers` (in place: each binding's header set
 * to its value, whatever the sandbox sent there) and refuses a request that still carries a
 * placeholder in its target or any header: a placeholder on its way to a host it is not bound
 * to is a secret leaving. The body goes through a placeholderGuard.
 */
export function brokerHeaders(
  headers: Record<string, string | string[] | undefined>,
  target: string,
  host: string,
  port: number,
  bindings: readonly BrokerBinding[],
): Brokered {
  let used: BrokerBinding | undefined;
  for (const b of bindings) {
    if (!hostAllowed([b.host], host, port)) continue;
    headers[b.header.toLowerCase()] = b.value;
    used ??= b;
  }
  const sent = [target, ...Object.values(headers).flat()].join('\n');
  if (bindings.some((b) => sent.includes(b.placeholder))) return { ok: false, reason: PLACEHOLDER_REFUSED };
  return { ok: true, binding: used };
}

/**
 * What a brokered request's body, or a tunnel's bytes, pass through on their way out: each
 * chunk passed on at once (an interactive protocol is not held up), but a chunk that completes
 * a placeholder (searched for across the chunks before it too) fails the stream with
 * PLACEHOLDER_REFUSED and is not passed on: at most the beginning of a placeholder leaves.
 */
export function placeholderGuard(bindings: readonly BrokerBinding[]): Transform {
  const placeholders = [...new Set(bindings.map((b) => b.placeholder))];
  if (placeholders.length === 0) return new PassThrough();
  const keep = Math.max(...placeholders.map((p) => Buffer.byteLength(p))) - 1;
  let tail = Buffer.alloc(0);
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      const seen = tail.length > 0 ? Buffer.concat([tail, chunk]) : chunk;
      if (placeholders.some((p) => seen.includes(p))) {
        done(Object.assign(new Error(PLACEHOLDER_REFUSED), { code: 'placeholder_refused' }));
        return;
      }
      tail = Buffer.from(seen.subarray(Math.max(0, seen.length - keep)));
      done(null, chunk);
    },
  });
}

/**
 * One sandbox's broker: its certificate authority and the bound secrets its conversations'
 * processes hold placeholders of (the build's and every turn's; a later one of the same
 * placeholder replaces the earlier).
 */
export class SandboxBroker {
  private readonly byPlaceholder = new Map<string, BrokerBinding[]>();
  /** The conversation the sandbox's unproxied requests (its loopback bridges) are logged under. */
  conversationId: string;

  constructor(
    readonly ca: SandboxCa,
    conversationId: string,
  ) {
    this.conversationId = conversationId;
  }

  add(bindings: readonly BrokerBinding[]): void {
    const fresh = new Map<string, BrokerBinding[]>();
    for (const b of bindings) fresh.set(b.placeholder, [...(fresh.get(b.placeholder) ?? []), b]);
    for (const [placeholder, list] of fresh) this.byPlaceholder.set(placeholder, list);
  }

  get bindings(): BrokerBinding[] {
    return [...this.byPlaceholder.values()].flat();
  }
}

const ALGORITHM = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const DAY_MS = 24 * 60 * 60 * 1000;

function pem(label: string, der: ArrayBuffer): string {
  const b64 = Buffer.from(der)
    .toString('base64')
    .replace(/(.{64})/g, '$1\n');
  return `-----BEGIN ${label}-----\n${b64.trimEnd()}\n-----END ${label}-----\n`;
}

/**
 * A sandbox's own certificate authority, made when its broker is prepared: its certificate is
 * given to the sandbox to trust, its key never leaves the runner. It signs, on demand, a leaf
 * certificate for each host the sandbox calls over TLS, so the runner can read (and broker)
 * the requests, then send them on over TLS to the real host.
 */
export class SandboxCa {
  private readonly leaves = new Map<string, Promise<{ key: string; cert: string }>>();

  private constructor(
    private readonly keys: webcrypto.CryptoKeyPair,
    private readonly cert: x509.X509Certificate,
  ) {}

  static async create(sandbox: string): Promise<SandboxCa> {
    const keys = (await webcrypto.subtle.generateKey(ALGORITHM, false, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
    const now = Date.now();
    const cert = await x509.X509CertificateGenerator.createSelfSigned({
      serialNumber: Buffer.from(webcrypto.getRandomValues(new Uint8Array(8))).toString('hex'),
      name: `CN=svc sandbox ${sandbox} broker CA`,
      notBefore: new Date(now - DAY_MS),
      notAfter: new Date(now + 365 * DAY_MS),
      keys,
      signingAlgorithm: ALGORITHM,
      extensions: [
        new x509.BasicConstraintsExtension(true, 0, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      ],
    });
    return new SandboxCa(keys, cert);
  }

  /** The CA certificate, PEM: what the sandbox trusts. */
  get certPem(): string {
    return this.cert.toString('pem');
  }

  /** A key and certificate (PEM) for `host`, signed by this CA; made once per host. */
  leaf(host: string): Promise<{ key: string; cert: string }> {
    let made = this.leaves.get(host);
    if (!made) {
      made = this.makeLeaf(host);
      this.leaves.set(host, made);
    }
    return made;
  }

  private async makeLeaf(host: string): Promise<{ key: string; cert: string }> {
    const keys = (await webcrypto.subtle.generateKey(ALGORITHM, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
    const now = Date.now();
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: Buffer.from(webcrypto.getRandomValues(new Uint8Array(8))).toString('hex'),
      subject: `CN=${host}`,
      issuer: this.cert.subject,
      notBefore: new Date(now - DAY_MS),
      notAfter: new Date(now + 30 * DAY_MS),
      signingAlgorithm: ALGORITHM,
      publicKey: keys.publicKey,
      signingKey: this.keys.privateKey,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
        new x509.SubjectAlternativeNameExtension([{ type: isIP(host) ? 'ip' : 'dns', value: host }]),
      ],
    });
    const key = pem('PRIVATE KEY', await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
    // The chain, leaf first; each PEM block on lines of its own.
    return { key, cert: `${cert.toString('pem').trimEnd()}\n${this.certPem.trimEnd()}\n` };
  }
}
