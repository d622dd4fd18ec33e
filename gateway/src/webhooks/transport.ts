import { lookup } from 'node:dns/promises';
import { type BlockList, isIP } from 'node:net';
import { Agent, buildConnector, request } from 'undici';
import { addressProblem } from './addresses.ts';

/** Resolves a host name to every address it has (the system resolver, or a test's). */
export type Resolver = (hostname: string) => Promise<string[]>;

export const systemResolver: Resolver = async (hostname) =>
  (await lookup(hostname, { all: true, verbatim: true })).map((a) => a.address);

export interface TransportOptions {
  resolve: Resolver;
  /** Ranges the operator lets webhooks reach although they are not public (WEBHOOK_ALLOW_CIDRS). */
  allowed?: BlockList;
  /** Extra certificate authorities to trust (a test's own); unset, Node's bundled ones. */
  ca?: string;
  timeoutMs: number;
  /** How much of the response body is kept. */
  keepBytes: number;
}

/** What one request came to: the receiver's status and the start of its body, or why none came. */
export interface SendResult {
  statusCode: number | null;
  /** The first `keepBytes` of the body (as text), or the reason no answer came. */
  detail: string;
}

/** A refusal that is the service's own decision, not a network failure. */
class Refused extends Error {}

/**
 * Every address `host` resolves to, all of them checked: one refused answer refuses the host
 * (a name that resolves to a public and a private address is not sent to either).
 */
async function checkedAddresses(host: string, o: TransportOptions): Promise<string[]> {
  const bare = host.startsWith('[') ? host.slice(1, -1) : host;
  let addresses: string[];
  if (isIP(bare)) addresses = [bare];
  else {
    try {
      addresses = await o.resolve(bare);
    } catch (err) {
      throw new Refused(`could not resolve ${bare}: ${(err as Error).message}`);
    }
  }
  if (addresses.length === 0) throw new Refused(`${bare} has no address`);
  for (const address of addresses) {
    const problem = addressProblem(address, o.allowed);
    if (problem) {
      throw new Refused(
        `refused: ${bare} resolves to ${problem}, which webhooks may not reach (an operator allows a range with WEBHOOK_ALLOW_CIDRS)`,
      );
    }
  }
  return addresses;
}

/**
 * POSTs `body` to `url` without letting a webhook reach what it must not (SPEC Webhooks, URL
 * rules): the host is resolved and every answer checked before the request, and again inside
 * the connection itself, which dials the addresses it just checked, in the resolver's order,
 * until one takes the connection (so a name that changes its answer between the two, DNS
 * rebinding, is refused at connect time, and one dead address does not fail a host that has
 * others) while the Host header and TLS SNI keep the original name. One connection per request (no pooled socket skips the
 * check), no redirects followed (a 3xx is an answer like any other), no proxy variables read
 * (undici's Agent never reads them). Never throws: a refusal, a timeout or a network error is a
 * result with `statusCode` null and the reason in `detail`.
 */
export async function postSafely(
  url: string,
  headers: Record<string, string>,
  body: string,
  o: TransportOptions,
): Promise<SendResult> {
  let target: URL;
  try {
    target = new URL(url);
  } catch {
    return { statusCode: null, detail: 'the endpoint URL does not parse' };
  }
  const servername = isIP(target.hostname.replace(/^\[|\]$/g, '')) ? undefined : target.hostname;
  const signal = AbortSignal.timeout(o.timeoutMs);
  const base = buildConnector({ ...(o.ca ? { ca: o.ca } : {}), timeout: o.timeoutMs, keepAlive: false });
  const agent = new Agent({
    connections: 1,
    pipelining: 0,
    connect: (opts, callback) => {
      checkedAddresses(opts.hostname, o).then(
        (addresses) => {
          // Every answer was checked just now; the first that takes the connection is used.
          const dial = (i: number) =>
            base({ ...opts, hostname: addresses[i] as string, servername }, (err, socket) => {
              if (err && i + 1 < addresses.length && !signal.aborted) dial(i + 1);
              else if (err) callback(err, null);
              else callback(null, socket as NonNullable<typeof socket>);
            });
          dial(0);
        },
        (err: Error) => callback(err, null),
      );
    },
  });
  try {
    await checkedAddresses(target.hostname, o);
    const res = await request(target, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'user-agent': 'svc-webhooks/1', ...headers },
      body,
      dispatcher: agent,
      signal,
      headersTimeout: o.timeoutMs,
      bodyTimeout: o.timeoutMs,
    });
    const chunks: Buffer[] = [];
    let kept = 0;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      if (kept < o.keepBytes) {
        chunks.push(chunk.subarray(0, o.keepBytes - kept));
        kept += Math.min(chunk.length, o.keepBytes - kept);
      }
      if (kept >= o.keepBytes) break;
    }
    return { statusCode: res.statusCode, detail: Buffer.concat(chunks).toString('utf8') };
  } catch (err) {
    return { statusCode: null, detail: reasonOf(err as Error, signal, o.timeoutMs) };
  } finally {
    agent.destroy().catch(() => {});
  }
}

function reasonOf(err: Error, signal: AbortSignal, timeoutMs: number): string {
  if (err instanceof Refused) return err.message;
  const cause = (err as { cause?: unknown }).cause;
  if (cause instanceof Refused) return cause.message;
  if (signal.aborted || /timeout/i.test(err.name) || /timeout/i.test((err as { code?: string }).code ?? '')) {
    return `no answer within ${timeoutMs / 1000} s`;
  }
  const code = (err as { code?: string }).code ?? (cause as { code?: string } | undefined)?.code;
  const message = cause instanceof Error ? cause.message : err.message;
  return code ? `${code}: ${message}` : message;
}
