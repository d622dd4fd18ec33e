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

/** A host as entries and requests are compared: lower case, no trailing dot, a v6 address bare. */
export function normalHost(host: string): string {
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
