/**
 * The floor: a bare uWebSockets.js SSE server. `GET /sub/<channel>` is held open after
 * `: connected`; `POST /pub/<channel>` writes its body as one `data:` frame to every response
 * of the channel; `GET /memory` is the V8 heap, for the bench. No auth, no log, no backpressure
 * handling: what holding and writing an SSE response costs and nothing else. Run as its own
 * process by peers/uws-sse.ts.
 */
import uWS, { type HttpResponse } from 'uWebSockets.js';

const channels = new Map<string, Set<HttpResponse>>();
uWS
  .App()
  .get('/sub/:channel', (res, req) => {
    const id = req.getParameter(0) ?? '';
    const subscribers = channels.get(id) ?? (channels.set(id, new Set()).get(id) as Set<HttpResponse>);
    subscribers.add(res);
    res.onAborted(() => subscribers.delete(res));
    res.cork(() => res.writeHeader('content-type', 'text/event-stream').write(': connected\n\n'));
  })
  .post('/pub/:channel', (res, req) => {
    const subscribers = channels.get(req.getParameter(0) ?? '');
    let body = '';
    res.onAborted(() => {});
    res.onData((chunk, last) => {
      body += Buffer.from(chunk).toString();
      if (!last) return;
      // Encoded once, as ours does (a string would be encoded again on every write).
      const frame = Buffer.from(`data: ${body}\n\n`);
      for (const s of subscribers ?? []) s.cork(() => s.write(frame));
      res.cork(() => res.end('ok'));
    });
  })
  // For the bench's memory reading: a full GC (when node runs with --expose-gc), then the V8
  // heap, committed and used, as ops/memory#heap reports ours.
  .get('/memory', (res) => {
    (globalThis as { gc?: () => void }).gc?.();
    const { heapTotal, heapUsed } = process.memoryUsage();
    res.cork(() =>
      res.writeHeader('content-type', 'application/json').end(JSON.stringify({ total: heapTotal, used: heapUsed })),
    );
  })
  .listen('127.0.0.1', Number(process.argv[2] ?? 0), (socket) => {
    if (!socket) process.exit(1);
    process.stdout.write(`listening on ${uWS.us_socket_local_port(socket)}\n`);
  });
