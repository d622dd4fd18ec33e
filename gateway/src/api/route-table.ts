import type { RouteOptions } from 'fastify';

interface Entry {
  method: string;
  url: string;
  pattern: RegExp;
  hidden: boolean;
}

/**
 * Every route the api role registered, kept for two jobs: telling 405 from 404 (a path that
 * exists under another method), and the test that every route has an OpenAPI entry.
 */
export class RouteTable {
  readonly entries: Entry[] = [];

  add(route: RouteOptions): void {
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    const source = route.url
      .split('/')
      .map((seg) => (seg.startsWith(':') ? '[^/]+' : seg === '*' ? '.*' : seg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')))
      .join('/');
    const hidden = Boolean((route.schema as { hide?: boolean } | undefined)?.hide);
    for (const method of methods) {
      if (method === 'HEAD' || method === 'OPTIONS') continue;
      this.entries.push({ method, url: route.url, pattern: new RegExp(`^${source}/?$`), hidden });
    }
  }

  methodsFor(path: string): string[] {
    return [...new Set(this.entries.filter((e) => e.pattern.test(path)).map((e) => e.method))];
  }
}
