// Client addresses and address ranges, as every role reads them: canonical text, CIDR lists
// (TRUST_PROXY, RATE_LIMIT_EXEMPT, WEBHOOK_ALLOW_CIDRS) and the client behind trusted proxies.
import { BlockList, isIP } from 'node:net';

/**
 * uWebSockets.js reports addresses in long IPv6 text ("0000:...:ffff:7f00:0001"); rate limits
 * and audit rows want the canonical form ("127.0.0.1", "::1").
 */
export function canonicalIp(text: string): string {
  const dotted = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i.exec(text);
  if (dotted?.[1]) return dotted[1];
  const mapped = /^(?:0{1,4}:){5}ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(text);
  if (mapped?.[1] && mapped[2]) {
    const hi = Number.parseInt(mapped[1], 16);
    const lo = Number.parseInt(mapped[2], 16);
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  if (isIP(text) === 6) {
    // Collapse to the compressed form through the URL parser.
    try {
      return new URL(`http://[${text}]/`).hostname.slice(1, -1);
    } catch {
      return text;
    }
  }
  return text;
}

/**
 * The canonical text of an address in uWebSockets.js's binary form (`getRemoteAddress`: 4 bytes,
 * or 16 for IPv6, IPv4-mapped included): what `canonicalIp` makes of its long text, without
 * the text. It is read on every request, and formatting the bytes here costs a fraction of
 * uWS formatting them and the regular expressions parsing them back.
 */
export function addressText(bytes: Uint8Array): string {
  if (bytes.length === 4) return `${bytes[0]}.${bytes[1]}.${bytes[2]}.${bytes[3]}`;
  if (bytes.length !== 16) return '';
  let mapped = bytes[10] === 0xff && bytes[11] === 0xff;
  for (let i = 0; mapped && i < 10; i++) if (bytes[i] !== 0) mapped = false;
  if (mapped) return `${bytes[12]}.${bytes[13]}.${bytes[14]}.${bytes[15]}`;
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push((((bytes[i] as number) << 8) | (bytes[i + 1] as number)).toString(16));
  return canonicalIp(groups.join(':'));
}

/** A list of CIDRs or bare addresses (RATE_LIMIT_EXEMPT, TRUST_PROXY) to check addresses against. */
export function exemptList(cidrs: readonly string[]): BlockList {
  const list = new BlockList();
  for (const entry of cidrs) {
    const [addr, bits] = entry.split('/');
    if (!addr) continue;
    const family = isIP(addr) === 6 ? 'ipv6' : 'ipv4';
    if (bits === undefined) list.addAddress(addr, family);
    else list.addSubnet(addr, Number(bits), family);
  }
  return list;
}

/** Whether an address is in a list of CIDRs (see exemptMatcher). */
export type AddressMatcher = (ip: string) => boolean;

/**
 * A check of addresses against `cidrs` (RATE_LIMIT_EXEMPT, TRUST_PROXY), made for a call on
 * every request: with no entries it answers false without looking; otherwise it remembers the
 * answers for up to `MEMO_SIZE` addresses, since `BlockList.check` builds a native
 * SocketAddress per call (about 5 µs, a twentieth of a small request's CPU). Past that many
 * it starts over.
 */
export function exemptMatcher(cidrs: readonly string[]): AddressMatcher {
  if (cidrs.length === 0) return () => false;
  const list = exemptList(cidrs);
  const memo = new Map<string, boolean>();
  return (ip) => {
    let exempt = memo.get(ip);
    if (exempt === undefined) {
      if (memo.size >= MEMO_SIZE) memo.clear();
      exempt = isExempt(list, ip);
      memo.set(ip, exempt);
    }
    return exempt;
  };
}
const MEMO_SIZE = 4096;

export function isExempt(list: BlockList, ip: string): boolean {
  const family = isIP(ip);
  if (family === 0) return false;
  return list.check(ip, family === 6 ? 'ipv6' : 'ipv4');
}

/** Why a TRUST_PROXY or RATE_LIMIT_EXEMPT entry cannot be used, or undefined when it can. */
export function cidrProblem(entry: string): string | undefined {
  const [addr, bits, extra] = entry.split('/');
  const family = isIP(addr ?? '');
  if (!family || extra !== undefined) return `${entry} is not an address or a CIDR`;
  if (bits === undefined) return undefined;
  const max = family === 4 ? 32 : 128;
  return /^\d{1,3}$/.test(bits) && Number(bits) <= max ? undefined : `${entry}: the prefix must be 0 to ${max}`;
}

/** One X-Forwarded-For entry as an address: without a port or brackets; undefined when none. */
function forwardedAddress(entry: string): string | undefined {
  const text = entry.trim();
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(text);
  const v4WithPort = /^(\d{1,3}(?:\.\d{1,3}){3}):\d+$/.exec(text);
  const addr = bracketed?.[1] ?? v4WithPort?.[1] ?? text;
  return isIP(addr) ? canonicalIp(addr) : undefined;
}

/**
 * The client's address (TRUST_PROXY): the socket's peer, unless the peer is a trusted proxy;
 * then X-Forwarded-For is walked from the right (each proxy appends the address it saw) past
 * every trusted hop, and the first address that is not trusted is the client. What the client
 * wrote itself sits left of that and is never read. When every hop is trusted, the leftmost;
 * an entry that is not an address ends the walk at the hop before it.
 * `forwardedFor` is every X-Forwarded-For header of the request, joined with commas.
 */
export function clientAddress(
  peer: string,
  forwardedFor: string | undefined,
  trusted: AddressMatcher | undefined,
): string {
  let client = canonicalIp(peer);
  if (!trusted || !forwardedFor || !trusted(client)) return client;
  const hops = forwardedFor.split(',');
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = forwardedAddress(hops[i] as string);
    if (hop === undefined) return client;
    client = hop;
    if (!trusted(hop)) return hop;
  }
  return client;
}
