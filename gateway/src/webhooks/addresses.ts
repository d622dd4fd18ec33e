import { BlockList, isIP } from 'node:net';

/*
 * Which addresses a webhook may reach: publicly routable ones only (SPEC Webhooks, URL rules).
 * Each refused range carries a name, so a refused delivery says why in words.
 */

type Range = readonly [cidr: string, what: string];

const V4: readonly Range[] = [
  ['0.0.0.0/8', 'this network'],
  ['10.0.0.0/8', 'private'],
  ['100.64.0.0/10', 'carrier-grade NAT'],
  ['127.0.0.0/8', 'loopback'],
  ['169.254.0.0/16', 'link-local'],
  ['172.16.0.0/12', 'private'],
  ['192.0.0.0/24', 'reserved (IETF protocol assignments)'],
  ['192.0.2.0/24', 'documentation'],
  ['192.88.99.0/24', 'reserved (6to4 relay)'],
  ['192.168.0.0/16', 'private'],
  ['198.18.0.0/15', 'reserved (benchmarking)'],
  ['198.51.100.0/24', 'documentation'],
  ['203.0.113.0/24', 'documentation'],
  ['224.0.0.0/4', 'multicast'],
  ['240.0.0.0/4', 'reserved'],
];

const V6: readonly Range[] = [
  ['::/128', 'unspecified'],
  ['::1/128', 'loopback'],
  ['64:ff9b:1::/48', 'reserved (local NAT64)'],
  ['100::/64', 'reserved (discard)'],
  ['2001::/23', 'reserved (IETF protocol assignments)'],
  ['2001:db8::/32', 'documentation'],
  ['2002::/16', 'reserved (6to4)'],
  ['3fff::/20', 'documentation'],
  ['fc00::/7', 'private (unique local)'],
  ['fe80::/10', 'link-local'],
  ['fec0::/10', 'reserved (site-local)'],
  ['ff00::/8', 'multicast'],
];

function listOf(ranges: readonly Range[], family: 'ipv4' | 'ipv6') {
  return ranges.map(([cidr, what]) => {
    const [addr, bits] = cidr.split('/') as [string, string];
    const list = new BlockList();
    list.addSubnet(addr, Number(bits), family);
    return { list, what };
  });
}

const v4Ranges = listOf(V4, 'ipv4');
const v6Ranges = listOf(V6, 'ipv6');
/** Global unicast: every IPv6 address outside it is reserved. */
const globalUnicast = new BlockList();
globalUnicast.addSubnet('2000::', 3, 'ipv6');

/** The IPv6 address as eight 16-bit groups, or undefined when it is not one. */
function groupsOf(ip: string): number[] | undefined {
  let text = ip.toLowerCase();
  const dotted = /^(.*:)(\d{1,3}(?:\.\d{1,3}){3})$/.exec(text);
  if (dotted?.[1] && dotted[2]) {
    const b = dotted[2].split('.').map(Number) as [number, number, number, number];
    text = `${dotted[1]}${((b[0] << 8) | b[1]).toString(16)}:${((b[2] << 8) | b[3]).toString(16)}`;
  }
  const [head, tail] = text.split('::') as [string, string | undefined];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const fill = tail === undefined ? [] : Array(8 - h.length - t.length).fill('0');
  const all = [...h, ...fill, ...t];
  return all.length === 8 ? all.map((g) => Number.parseInt(g, 16)) : undefined;
}

/**
 * The IPv4 address an IPv6 one carries where the IPv4 rules must decide: IPv4-mapped
 * (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`) and well-known NAT64 (`64:ff9b::/96`).
 */
function embeddedV4(ip: string): string | undefined {
  const g = groupsOf(ip);
  if (!g) return undefined;
  const zeros = (from: number, to: number) => g.slice(from, to).every((x) => x === 0);
  const mapped = zeros(0, 5) && g[5] === 0xffff;
  const compatible = zeros(0, 6) && (g[6] !== 0 || (g[7] ?? 0) > 1);
  const nat64 = g[0] === 0x64 && g[1] === 0xff9b && zeros(2, 6);
  if (!mapped && !compatible && !nat64) return undefined;
  const hi = g[6] as number;
  const lo = g[7] as number;
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

/**
 * Why `ip` may not be reached (`127.0.0.1 is loopback`), or undefined when it is publicly
 * routable or inside an operator's `allowed` ranges (WEBHOOK_ALLOW_CIDRS). Anything that is not
 * an address at all is refused too.
 */
export function addressProblem(ip: string, allowed?: BlockList): string | undefined {
  const family = isIP(ip);
  if (family === 0) return `${ip} is not an IP address`;
  if (allowed?.check(ip, family === 4 ? 'ipv4' : 'ipv6')) return undefined;
  if (family === 4) {
    const hit = v4Ranges.find((r) => r.list.check(ip, 'ipv4'));
    return hit ? `${ip} is ${hit.what}` : undefined;
  }
  const v4 = embeddedV4(ip);
  if (v4 !== undefined) {
    if (allowed?.check(v4, 'ipv4')) return undefined;
    const inner = addressProblem(v4);
    return inner ? `${ip} carries ${inner}` : undefined;
  }
  const hit = v6Ranges.find((r) => r.list.check(ip, 'ipv6'));
  if (hit) return `${ip} is ${hit.what}`;
  return globalUnicast.check(ip, 'ipv6') ? undefined : `${ip} is reserved`;
}
