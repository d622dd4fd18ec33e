import { z } from 'zod';

/** ISO 8601 timestamp in UTC, as every timestamp on the wire (SPEC Conventions 2). */
export const Timestamp = z.iso.datetime({ offset: false }).meta({ example: '2026-11-23T06:17:38.123Z' });

/** The body of every error answer: `{error, message}` plus code-specific fields. */
export const ErrorBody = z
  .object({
    error: z.string().meta({ description: 'Stable machine-readable code; branch on this.' }),
    message: z.string(),
    details: z
      .record(z.string(), z.array(z.string()))
      .optional()
      .meta({ description: 'On 422 validation_failed: field path to messages.' }),
  })
  .catchall(z.unknown())
  .meta({ id: 'Error' });

/** `{data: [...]}`, the shape of every list (SPEC Conventions 3). */
export function listOf<T extends z.ZodType>(item: T) {
  return z.object({ data: z.array(item) });
}

export const IdParam = z.object({ id: z.string().min(1).max(100) });

export const Ok = z.object({ ok: z.literal(true) });

/**
 * Text where the characters are content (a prompt, like a runtime's output in the log): a NUL
 * (U+0000), which Postgres text cannot hold, is kept as U+FFFD, what a decoder gives for a
 * byte it cannot map. Every other string refuses NUL at validation.
 */
export function nulAsReplacement(s: string): string {
  return s.includes('\0') ? s.replaceAll('\0', '\uFFFD') : s;
}

/** A string field whose text is content: NUL is stored as U+FFFD instead of being refused. */
export function contentText() {
  return z.string().overwrite(nulAsReplacement);
}
