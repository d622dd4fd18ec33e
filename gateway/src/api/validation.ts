import type { FastifySchemaCompiler } from 'fastify';
import { validatorCompiler as zodValidatorCompiler } from 'fastify-type-provider-zod';
import { z } from 'zod';

/** At most this many NUL findings are named in one answer. */
const MAX_FINDINGS = 20;

const NUL_MESSAGE = 'must not contain the NUL character (U+0000)';

/**
 * Request validation for every route: the route's zod schema, then one rule for every string it
 * let through, object keys included: no NUL (U+0000). Postgres text cannot hold one, so a NUL
 * that reached a query was a 500; refused here, it is a 422 `validation_failed` naming the
 * field (a 400 in a query or path), on every route, including those added later. A field whose
 * text is content (a prompt) is declared with `contentText()`, which has already turned NUL
 * into U+FFFD, so nothing is left for this rule to refuse.
 */
export const validatorCompiler: FastifySchemaCompiler<z.ZodType> = (route) =>
  zodValidatorCompiler({
    ...route,
    schema: route.schema instanceof z.ZodType ? route.schema.superRefine(refuseNul) : route.schema,
  });

function refuseNul(value: unknown, ctx: z.RefinementCtx): void {
  const found: PropertyKey[][] = [];
  findNul(value, [], found);
  for (const path of found) ctx.addIssue({ code: 'custom', path, message: NUL_MESSAGE });
}

/** Stands in the walk for a key that itself holds NUL: reported at the key's path. */
const NUL_KEY = Symbol('key holding NUL');

/** A path into the value, linked to its parent, so a deep walk never copies paths it does not report. */
type Path = { parent: Path | null; key: PropertyKey } | null;

function pathOf(at: Path): PropertyKey[] {
  const keys: PropertyKey[] = [];
  for (let p = at; p; p = p.parent) keys.push(p.key);
  return keys.reverse();
}

/**
 * Collects the paths of strings holding NUL, in document order. Only plain objects and arrays
 * are walked (the output of a JSON body, query or path), never a Buffer of raw bytes; a key
 * holding NUL is named with the NUL written `\u0000`. The walk keeps its own stack, so a body
 * nested thousands deep is judged like any other instead of overflowing the call stack (a 500).
 */
function findNul(root: unknown, rootPath: PropertyKey[], found: PropertyKey[][]): void {
  let base: Path = null;
  for (const key of rootPath) base = { parent: base, key };
  const stack: [unknown, Path][] = [[root, base]];
  while (stack.length && found.length < MAX_FINDINGS) {
    const [value, path] = stack.pop() as [unknown, Path];
    if (value === NUL_KEY) {
      found.push(pathOf(path));
      continue;
    }
    if (typeof value === 'string') {
      if (value.includes('\0')) found.push(pathOf(path));
      continue;
    }
    if (value === null || typeof value !== 'object') continue;
    const children: [unknown, Path][] = [];
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) children.push([value[i], { parent: path, key: i }]);
    } else {
      const proto = Object.getPrototypeOf(value);
      if (proto !== Object.prototype && proto !== null) continue;
      for (const [key, v] of Object.entries(value)) {
        if (key.includes('\0')) children.push([NUL_KEY, { parent: path, key: key.replaceAll('\0', '\\u0000') }]);
        else children.push([v, { parent: path, key }]);
      }
    }
    // Pushed last-first, so the first child is looked at next: findings keep document order.
    for (let i = children.length - 1; i >= 0; i--) stack.push(children[i] as [unknown, Path]);
  }
}
