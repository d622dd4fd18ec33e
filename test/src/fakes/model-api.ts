/**
 * What the fakes of model APIs share: a local HTTP server that reads each request whole and
 * hands it over with its JSON body parsed, and the cutting of streamed text into pieces.
 */
import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** A request as a fake sees it: `path` without the query, `body` null for none or bad JSON. */
export interface ApiRequest<B> {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  body: B | null;
}

/**
 * Starts a server on 127.0.0.1 (an ephemeral port) that calls `handle` once per request, after
 * its body has arrived. `close()` drops open connections (a stream in flight included).
 */
export async function startModelApi<B>(handle: (req: ApiRequest<B>, res: ServerResponse) => void) {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      let body: B | null = null;
      try {
        body = chunks.length ? (JSON.parse(Buffer.concat(chunks).toString('utf8')) as B) : null;
      } catch {}
      const path = (req.url ?? '/').split('?')[0] as string;
      handle({ method: req.method ?? '', path, headers: req.headers, body }, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** Cuts a string into pieces of at most `size` characters (the APIs stream text in pieces). */
export function pieces(text: string, size: number): string[] {
  const out: string[] = [];
  for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size));
  return out.length ? out : [''];
}
