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

/**
 * Collects the paths of strings holding NUL. Only plain objects and arrays are walked (the
 * output of a JSON body, query or path), never a Buffer of raw bytes; a key holding NUL is
 * named with the NUL written `\u0000`.
 */
function findNul(value: unknown, path: PropertyKey[], found: PropertyKey[][]): void {
  if (found.length >= MAX_FINDINGS) return;
  if (typeof value === 'string') {
    if (value.includes('\0')) found.push(path);
    return;
  }
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) findNul(value[i], [...path, i], found);
    return;
  }
  if (value === null || typeof value !== 'object') return;
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) return;
  for (const [key, v] of Object.entries(value)) {
    if (key.includes('\0')) {
      if (found.length < MAX_FINDINGS) found.push([...path, key.replaceAll('\0', '\\u0000')]);
    } else findNul(v, [...path, key], found);
  }
}
