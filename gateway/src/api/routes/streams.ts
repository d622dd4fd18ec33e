import type { ServerResponse } from 'node:http';
import type { ApiError } from '@svc/core';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Opening, StreamResponse } from '../../streams/response.ts';
import { STREAM_PATHS, type StreamServer } from '../../streams/streams.ts';

/**
 * The streams' transport when the api role serves alone (EDGE=false, or a platform with no
 * uWebSockets.js build): the same three paths and the same SSE code as the edge's, over
 * node's response. The rate limit was taken by the api role's own hook (streams count once,
 * at open); the stream authenticates the request itself, as at the edge.
 */
export function streamRoutes(app: FastifyInstance, streams: StreamServer): void {
  const route = { config: { auth: 'public' as const }, schema: { hide: true } };
  app.get<{ Params: { id: string } }>(STREAM_PATHS.conversation, route, (request, reply) => {
    reply.hijack();
    streams.conversation(new NodeStreamResponse(reply.raw), opening(request), request.params.id);
  });
  app.get(STREAM_PATHS.events, route, (request, reply) => {
    reply.hijack();
    streams.events(new NodeStreamResponse(reply.raw), opening(request));
  });
  app.get(STREAM_PATHS.team, route, (request, reply) => {
    reply.hijack();
    streams.team(new NodeStreamResponse(reply.raw), opening(request));
  });
}

function opening(request: FastifyRequest): Opening {
  const header = (name: string) => {
    const v = request.headers[name];
    return (Array.isArray(v) ? v[0] : v) ?? '';
  };
  return {
    // Read by the authentication hook from the socket or, through trusted proxies, X-Forwarded-For.
    ip: request.clientIp ?? request.ip,
    authorization: header('authorization'),
    cookie: header('cookie'),
    origin: header('origin'),
    lastEventId: header('last-event-id'),
    query: new URLSearchParams(request.url.split('?')[1] ?? ''),
    admit: () => undefined,
  };
}

/** A node response as a StreamResponse. */
class NodeStreamResponse implements StreamResponse {
  constructor(private readonly raw: ServerResponse) {
    // A write racing the client's disconnect errors; the close that follows ends the watcher.
    raw.on('error', () => {});
  }

  cork(fn: () => void): void {
    this.raw.cork();
    try {
      fn();
    } finally {
      this.raw.uncork();
    }
  }

  writeHead(headers: Record<string, string>): void {
    this.raw.writeHead(200, headers);
  }

  write(chunk: string | Buffer): boolean {
    return this.raw.write(chunk);
  }

  onDrain(handler: () => void): void {
    this.raw.once('drain', handler);
  }

  end(): void {
    this.raw.end();
  }

  close(): void {
    this.raw.destroy();
  }

  onAborted(target: { aborted(): void }): void {
    this.raw.once('close', () => {
      if (!this.raw.writableEnded) target.aborted();
    });
  }

  error(e: ApiError): void {
    this.raw.writeHead(e.status, {
      'content-type': 'application/json; charset=utf-8',
      ...(e.retryAfter !== undefined ? { 'retry-after': String(e.retryAfter) } : {}),
    });
    this.raw.end(JSON.stringify(e.body()));
  }
}
