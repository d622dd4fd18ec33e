import websocket from '@fastify/websocket';
import { ApiError, RUNNER_CONNECT_PATH } from '@svc/core';
import type { runners } from '@svc/db';
import type { FastifyInstance } from 'fastify';
import type { ApiDeps } from '../deps.ts';

/**
 * The runner fabric's transport when the api role serves alone (EDGE=off, or a platform with
 * no uWebSockets.js build): the same endpoint and session logic as the edge's, through
 * @fastify/websocket. The token is checked before the upgrade (401 in the error shape).
 * Described in OpenAPI with the edge routes (api/routes/meta.ts), so hidden here.
 */
export async function runnerSocketRoute(app: FastifyInstance, deps: ApiDeps): Promise<void> {
  // On close, runners hear 1001 going_away (reconnect) before the plugin's own close of every
  // socket, which gives no code: hooks run in the order they were added.
  app.addHook('preClose', (done) => {
    deps.fabric.shutdown();
    done();
  });
  await app.register(websocket, { options: { maxPayload: 16 * 1024 * 1024 } });
  const runnerOf = new WeakMap<object, runners.RunnerRow>();
  app.get(
    RUNNER_CONNECT_PATH,
    {
      websocket: true,
      config: { auth: 'public' },
      schema: { hide: true },
      preValidation: async (req) => {
        const runner = await deps.fabric.authenticate(req.headers.authorization);
        if (!runner) throw new ApiError('unauthorized', 'The runner token was not accepted.');
        runnerOf.set(req, runner);
      },
    },
    (socket, req) => {
      const runner = runnerOf.get(req) as runners.RunnerRow;
      let closed = false;
      const session = deps.fabric.attach(runner, {
        send: (frame) => {
          if (!closed) socket.send(frame);
        },
        close: (code, reason) => {
          if (closed) return;
          closed = true;
          socket.close(code, reason);
        },
      });
      socket.on('message', (data: Buffer, isBinary: boolean) => {
        session.message(isBinary ? new Uint8Array(data) : new Uint8Array(0));
      });
      socket.on('close', () => {
        closed = true;
        session.closed();
      });
    },
  );
}
