import type { LogEvent } from '../log/log.ts';

/** One SSE event: its id, optional event name, and the payload as one JSON line. */
export function frame(id: number, data: unknown, event?: string): string {
  return `id: ${id}\n${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`;
}

/** A frame as text (to join with others) and as the bytes written when it goes alone. */
export interface CachedFrame {
  text: string;
  bytes: Buffer;
}

/**
 * An event's frame for one shape of a stream (which stream, blocks or not), serialised once
 * per node however many watchers send it: every watcher of a tenant on this node receives
 * the same event objects from the feed, so the frame is cached on the object itself (a
 * WeakMap: it goes when the event does). Its UTF-8 bytes are cached too: a string handed to
 * the transport is encoded again on every write, once per watcher.
 */
const frameCaches = new Map<string, WeakMap<LogEvent, CachedFrame>>();
export function cachedFrame(shape: string, e: LogEvent, build: () => string): CachedFrame {
  let cache = frameCaches.get(shape);
  if (!cache) {
    cache = new WeakMap();
    frameCaches.set(shape, cache);
  }
  let f = cache.get(e);
  if (f === undefined) {
    const text = build();
    f = { text, bytes: Buffer.from(text) };
    cache.set(e, f);
  }
  return f;
}
