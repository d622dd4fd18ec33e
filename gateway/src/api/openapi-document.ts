import type { OpenApiDoc } from './discovery.ts';
import { addExamples } from './openapi-examples.ts';
import { errorResponse } from './route-docs.ts';
import type { RouteTable } from './route-table.ts';

/**
 * The last touches on the generated document that need all of it at once: where the API is
 * served (`servers`), the codes each error answer can carry, one component per schema, and
 * examples of the main bodies.
 */
export function finishDocument(d: OpenApiDoc, routes: RouteTable, publicUrl: string): void {
  d.servers = [{ url: publicUrl, description: 'This instance (PUBLIC_URL)' }];
  describeErrorCodes(d, routes);
  foldSchemaCopies(d);
  addExamples(d);
}

/** Every error status of every route lists the codes it can carry, with an example of each. */
function describeErrorCodes(d: OpenApiDoc, routes: RouteTable): void {
  for (const entry of routes.entries) {
    if (entry.hidden || !entry.errors) continue;
    const op = d.paths[entry.url.replace(/:([A-Za-z_]+)/g, '{$1}')]?.[entry.method.toLowerCase()];
    if (!op) continue;
    op.responses ??= {};
    for (const [status, codes] of entry.errors) {
      const declared = op.responses[String(status)]?.content?.['application/json']?.schema;
      op.responses[String(status)] = errorResponse(codes, declared) as never;
    }
  }
}

const REF = '#/components/schemas/';

/**
 * The schema generator emits every named schema twice, as read (`Agent`) and as written
 * (`AgentInput`), referenced or not. A client generator then sees two types for one resource.
 * Here a written copy that no route uses is dropped, one identical to its read copy is
 * replaced by it, and one whose read copy no route uses takes the plain name; only a written
 * shape that really differs from a read one keeps the `Input` suffix.
 */
export function foldSchemaCopies(d: OpenApiDoc): void {
  const schemas = d.components?.schemas;
  if (!schemas) return;
  const used = referencedSchemas(d);
  const plain = (s: unknown) => JSON.stringify(s).replace(/Input"/g, '"');
  const renames = new Map<string, string>();
  for (const name of used) {
    const base = name.endsWith('Input') ? name.slice(0, -'Input'.length) : undefined;
    if (!base || !schemas[base]) continue;
    if (!used.has(base) || plain(schemas[name]) === plain(schemas[base])) renames.set(name, base);
  }
  for (const [from, to] of renames) schemas[to] = schemas[from] as never;
  const rewritten = JSON.parse(
    JSON.stringify({ paths: d.paths, schemas }, (key, value) =>
      key === '$ref' && typeof value === 'string' && value.startsWith(REF)
        ? `${REF}${renames.get(value.slice(REF.length)) ?? value.slice(REF.length)}`
        : value,
    ),
  );
  d.paths = rewritten.paths;
  d.components!.schemas = rewritten.schemas;
  const reachable = referencedSchemas(d);
  for (const name of Object.keys(d.components!.schemas!)) if (!reachable.has(name)) delete d.components!.schemas![name];
}

/** The component schemas the paths reference, directly or through other components. */
function referencedSchemas(d: OpenApiDoc): Set<string> {
  const found = new Set<string>();
  const schemas = d.components?.schemas ?? {};
  const walk = (value: unknown): void => {
    if (Array.isArray(value)) for (const v of value) walk(v);
    else if (value && typeof value === 'object') {
      for (const [key, v] of Object.entries(value)) {
        if (key === '$ref' && typeof v === 'string' && v.startsWith(REF)) {
          const name = v.slice(REF.length);
          if (!found.has(name)) {
            found.add(name);
            walk(schemas[name]);
          }
        } else walk(v);
      }
    }
  };
  walk(d.paths);
  return found;
}
