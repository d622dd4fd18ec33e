/**
 * The SSE helpers the stream tests read responses with: they must read the wire as a browser
 * does, or a stream test could pass on a stream a browser reads differently.
 */
import fc from 'fast-check';
import t from 'tap';
import { frames, parseFrame } from './sse-client.ts';

/** A response head and `body` in HTTP/1.1 chunks of `sizes` bytes (the last takes the rest). */
function chunked(body: string, sizes: number[] = []): string {
  const bytes = Buffer.from(body, 'utf8');
  let out = 'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n';
  let at = 0;
  for (const size of [...sizes, bytes.length]) {
    const part = bytes.subarray(at, Math.min(bytes.length, at + size));
    if (part.length === 0) continue;
    out += `${part.length.toString(16)}\r\n${part.toString('latin1')}\r\n`;
    at += part.length;
  }
  return out;
}

t.test('data spread over several lines is one value joined by newlines, as a browser reads it', async (t) => {
  t.same(parseFrame('id: 4\nevent: note\ndata: first\ndata: second'), {
    id: '4',
    event: 'note',
    data: 'first\nsecond',
  });
});

t.test('a bare id, a comment and a field without a space read as the standard says', async (t) => {
  t.same(parseFrame('id: 1795578228161312'), { id: '1795578228161312' }, 'a bare id has no data');
  t.same(parseFrame(': connected'), { comment: 'connected' });
  t.same(parseFrame('data:{"a":1}'), { data: '{"a":1}' }, 'the space after the colon is optional');
});

t.test('a frame or a chunk still arriving is not a frame yet', async (t) => {
  const body = ': connected\n\nid: 1\ndata: {"text":"héllo"}\n\nid: 2\ndata: {"te';
  t.same(frames(chunked(body)), [': connected', 'id: 1\ndata: {"text":"héllo"}']);
  const whole = chunked(': connected\n\nid: 1\ndata: x\n\n');
  t.same(frames(whole.slice(0, whole.length - 5)), [], 'a chunk cut short is left out');
});

t.test('however the body is cut into chunks, the frames and their fields are the same', async () => {
  const event = fc.record({
    id: fc.integer({ min: 1, max: 2 ** 52 }),
    data: fc.string({ unit: 'grapheme', minLength: 1 }).filter((s) => !/[\r\n]/.test(s)),
  });
  fc.assert(
    fc.property(
      fc.array(event, { minLength: 1, maxLength: 8 }),
      fc.array(fc.integer({ min: 1, max: 40 })),
      (events, sizes) => {
        const body = `: connected\n\n${events.map((e) => `id: ${e.id}\ndata: ${e.data}\n\n`).join('')}`;
        const read = frames(chunked(body, sizes)).map(parseFrame);
        return (
          JSON.stringify(read) ===
          JSON.stringify([{ comment: 'connected' }, ...events.map((e) => ({ id: String(e.id), data: e.data }))])
        );
      },
    ),
  );
});
