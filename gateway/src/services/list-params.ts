import type { ApiError } from '@svc/core';

/** A comma-separated list of values from `allowed` (a query parameter); anything else is the given error. */
export function csv<T extends string>(
  value: string | undefined,
  allowed: readonly T[],
  error: () => ApiError,
): T[] | undefined {
  if (value === undefined || value.trim() === '') return undefined;
  const items = value.split(',').map((s) => s.trim());
  for (const item of items) if (!(allowed as readonly string[]).includes(item)) throw error();
  return items as T[];
}
