import { BlockList, isIP } from 'node:net';

/**
 * uWebSockets.js reports addresses in long IPv6 text ("0000:...:ffff:7f00:0001"); rate limits
 * and audit rows want the canonical form ("127.0.0.1", "::1").
 */
export function canonicalIp(text: string): string {
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

/** RATE_LIMIT_EXEMPT: a list of CIDRs (or bare addresses) whose requests are never limited. */
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

export function isExempt(list: BlockList, ip: string): boolean {
  const family = isIP(ip);
  if (family === 0) return false;
  return list.check(ip, family === 6 ? 'ipv6' : 'ipv4');
}
