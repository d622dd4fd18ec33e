import type { RouteOptions } from 'fastify';
import type { ErrorCodes } from './route-docs.ts';

interface Entry {
  method: string;
  url: string;
  pattern: RegExp;
  hidden: boolean;
  /** The catalogue codes of each error status, for the OpenAPI document (none when hidden). */
  errors: ErrorCodes | undefined;
}

/**
 * Every route the api role registered, kept for three jobs: telling 405 from 404 (a path that
 * exists under another method), the error codes its OpenAPI entry lists, and the test that
 * every route has an OpenAPI entry.
 */
export class RouteTable {
  readonly entries: Entry[] = [];

  add(route: RouteOptions, errors?: ErrorCodes): void {
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    const source = route.url
      .split('/')
      .map((seg) => (seg.startsWith(':') ? '[^/]+' : seg === '*' ? '.*' : seg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')))
      .join('/');
    const hidden = Boolean((route.schema as { hide?: boolean } | undefined)?.hide);
    for (const method of methods) {
      if (method === 'HEAD' || method === 'OPTIONS') continue;
      this.entries.push({ method, url: route.url, pattern: new RegExp(`^${source}/?$`), hidden, errors });
    }
  }

  methodsFor(path: string): string[] {
    return [...new Set(this.entries.filter((e) => e.pattern.test(path)).map((e) => e.method))];
  }
}
